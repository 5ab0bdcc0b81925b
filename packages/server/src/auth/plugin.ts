import { CairnProblem } from '@cairn/protocol'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import type { ApiKeyStore, Principal } from './api-keys.js'

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal | undefined
  }
}

/**
 * The per-key and per-tenant budgets that every way in draws on: the /v1 routes, the compat API
 * and terminal sockets (a tenant's requests through one are requests through the others).
 */
export class RateLimits {
  readonly key: RateLimiter
  /** All of a tenant's keys together: more keys are not more requests. */
  readonly tenant: RateLimiter

  constructor(limits: { ratePerSecond?: number | undefined; tenantRatePerSecond?: number | undefined } = {}) {
    this.key = new RateLimiter(limits.ratePerSecond ?? 1000)
    this.tenant = new RateLimiter(limits.tenantRatePerSecond ?? limits.ratePerSecond ?? 1000)
  }

  /** Takes one request from `principal`'s budgets, or refuses it (`rate_limited`). */
  admit(principal: Principal): void {
    if (!this.key.take(principal.keyId))
      throw new CairnProblem(
        'rate_limited',
        `too many requests for this API key (limit ${this.key.ratePerSecond}/s)`,
      )
    if (!this.tenant.take(principal.tenantId))
      throw new CairnProblem(
        'rate_limited',
        `too many requests for this tenant, all its API keys together (limit ${this.tenant.ratePerSecond}/s)`,
      )
  }
}

/**
 * Bearer authentication on everything under /v1 (the OpenAPI document excepted), within `limits`.
 * Decided on the route the router matched, not on the request's own spelling of its path: the
 * router decodes percent-escapes (`/%761/sessions`) and takes an absolute-form target
 * (`http://host/v1/sessions`), which the raw URL's prefix did not see, so such a request reached
 * its route unauthenticated and unmetered, its body (up to the upload cap) read before a handler
 * refused it.
 */
export function installAuth(
  app: FastifyInstance,
  keys: ApiKeyStore,
  limits: RateLimits,
  /** Routes that authorize on their own (previews: a key or a signed URL). */
  exempt?: (request: FastifyRequest) => boolean,
): void {
  app.decorateRequest('principal', undefined)
  app.addHook('onRequest', async (request) => {
    const url = request.routeOptions.url ?? request.url
    if (!url.startsWith('/v1/') && url !== '/v1') return
    if (url === '/v1/openapi.json') return
    if (exempt?.(request)) return
    const header = request.headers.authorization
    const match = header ? /^Bearer\s+(\S+)$/i.exec(header) : null
    if (!match?.[1])
      throw new CairnProblem('unauthorized', 'missing API key: send Authorization: Bearer <key>')
    const principal = await keys.verify(match[1])
    if (!principal) throw new CairnProblem('unauthorized', 'invalid API key')
    limits.admit(principal)
    request.principal = principal
  })
}

export function principalOf(request: FastifyRequest): Principal {
  if (!request.principal) throw new CairnProblem('unauthorized', 'missing API key')
  return request.principal
}

export function requireWrite(request: FastifyRequest): Principal {
  return writer(principalOf(request))
}

/** The principal, when its key may change things; a read-only key is refused (`forbidden`). */
export function writer(principal: Principal): Principal {
  if (principal.role === 'read') throw new CairnProblem('forbidden', 'this API key is read-only')
  return principal
}

/** Token bucket per key (an API key, a tenant): `ratePerSecond` sustained, twice that as a burst; 0 turns it off. */
export class RateLimiter {
  private readonly buckets = new Map<string, { tokens: number; at: number }>()

  constructor(readonly ratePerSecond: number) {}

  take(key: string, now = performance.now()): boolean {
    if (this.ratePerSecond <= 0) return true
    const burst = this.ratePerSecond * 2
    const bucket = this.buckets.get(key) ?? { tokens: burst, at: now }
    bucket.tokens = Math.min(burst, bucket.tokens + ((now - bucket.at) / 1000) * this.ratePerSecond)
    bucket.at = now
    if (bucket.tokens < 1) {
      this.buckets.set(key, bucket)
      return false
    }
    bucket.tokens -= 1
    this.buckets.set(key, bucket)
    return true
  }
}
