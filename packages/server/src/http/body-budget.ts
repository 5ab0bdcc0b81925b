import { Transform, type TransformCallback } from 'node:stream'
import { CairnProblem } from '@cairn/protocol'
import type { FastifyInstance, FastifyRequest } from 'fastify'

export interface BodyBudgetLimits {
  /** Bytes of request bodies one tenant's requests may hold at once (`CAIRN_MAX_BODY_BYTES_PER_TENANT`). */
  perTenantBytes: number
  /** Bytes of request bodies all requests may hold at once (`CAIRN_MAX_BODY_BYTES`). */
  totalBytes: number
}

const MIB = 1024 * 1024
/** Largest JSON body a route takes. */
export const JSON_BODY_LIMIT_BYTES = 2 * MIB

/**
 * The limits given (each undefined: its default, 256 MiB a tenant and 1 GiB in all), raised to
 * what one request may send: a request of the largest size always fits, or its retries never would.
 */
export function bodyBudgetLimits(
  given: { perTenantBytes?: number | undefined; totalBytes?: number | undefined },
  maxUploadBytes: number,
): BodyBudgetLimits {
  for (const value of [given.perTenantBytes, given.totalBytes])
    if (value !== undefined && !(Number.isFinite(value) && value > 0))
      throw new CairnProblem(
        'validation_failed',
        `CAIRN_MAX_BODY_BYTES and CAIRN_MAX_BODY_BYTES_PER_TENANT must be positive numbers of bytes, not '${value}'`,
      )
  const perTenantBytes = Math.max(
    given.perTenantBytes ?? 256 * MIB,
    Math.max(maxUploadBytes, JSON_BODY_LIMIT_BYTES),
  )
  return { perTenantBytes, totalBytes: Math.max(given.totalBytes ?? 1024 * MIB, perTenantBytes) }
}

/**
 * The memory request bodies hold: a body is read whole before its handler runs (an upload up to
 * the upload cap, 100 MiB by default), so without a bound a tenant's concurrent uploads held the
 * cap as many times as it opened connections (10 at once: 1.8 GiB of the server's memory). Each
 * body counts from its first byte (its declared length at once) until its request is answered
 * or its client leaves; past the tenant's share a request is refused `429 rate_limited`, past the
 * total `503 unavailable`, both before more of the body is read.
 */
export class BodyBudget {
  private total = 0
  private readonly tenants = new Map<string, number>()

  constructor(readonly limits: BodyBudgetLimits) {}

  /** Bytes held now (all tenants). */
  get heldBytes(): number {
    return this.total
  }

  /** Counts `bytes` more for `tenantId`, or refuses them (nothing counted). */
  take(tenantId: string, bytes: number): void {
    const tenant = this.tenants.get(tenantId) ?? 0
    if (tenant + bytes > this.limits.perTenantBytes)
      throw new CairnProblem(
        'rate_limited',
        `this tenant's request bodies being read hold ${mib(tenant)} MiB of the ${mib(this.limits.perTenantBytes)} MiB they may (CAIRN_MAX_BODY_BYTES_PER_TENANT); retry once one is answered`,
        { limitBytes: this.limits.perTenantBytes },
      )
    if (this.total + bytes > this.limits.totalBytes)
      throw new CairnProblem(
        'unavailable',
        `the request bodies being read hold ${mib(this.total)} MiB of the ${mib(this.limits.totalBytes)} MiB the server takes at once (CAIRN_MAX_BODY_BYTES); retry`,
      )
    this.tenants.set(tenantId, tenant + bytes)
    this.total += bytes
  }

  /**
   * Counts `bytes` for `tenantId` whatever they make (bytes already read, such as a WebSocket
   * message): whether the tenant and the total are still within their limits after them.
   */
  hold(tenantId: string, bytes: number): boolean {
    const tenant = (this.tenants.get(tenantId) ?? 0) + bytes
    this.tenants.set(tenantId, tenant)
    this.total += bytes
    return this.within(tenantId)
  }

  /** Whether `tenantId` and the total hold no more than their limits. */
  within(tenantId: string): boolean {
    return (
      (this.tenants.get(tenantId) ?? 0) <= this.limits.perTenantBytes && this.total <= this.limits.totalBytes
    )
  }

  give(tenantId: string, bytes: number): void {
    const left = (this.tenants.get(tenantId) ?? 0) - bytes
    if (left > 0) this.tenants.set(tenantId, left)
    else this.tenants.delete(tenantId)
    this.total -= bytes
  }
}

function mib(bytes: number): string {
  return (bytes / MIB).toFixed(1)
}

/** What one request holds of the budget. */
interface Held {
  tenantId: string
  bytes: number
}

/**
 * Puts every authenticated request's body under `budget`: a declared length is taken before a
 * byte is read (at most `largestBodyBytes`: the parser refuses a longer one itself, 413), a
 * chunked body as it arrives; all of it is given back when the request is answered or aborted.
 */
export function installBodyBudget(app: FastifyInstance, budget: BodyBudget, largestBodyBytes: number): void {
  const held = new WeakMap<FastifyRequest, Held>()
  const release = async (request: FastifyRequest) => {
    const h = held.get(request)
    if (!h) return
    held.delete(request)
    budget.give(h.tenantId, h.bytes)
  }
  app.addHook('preParsing', async (request, reply, payload) => {
    const tenantId = request.principal?.tenantId
    if (tenantId === undefined) return payload
    const h: Held = { tenantId, bytes: 0 }
    held.set(request, h)
    // The response's close comes whatever happened: a streamed answer (hijacked) whose client
    // left after the body was read ran neither onResponse nor onRequestAbort, and kept its bytes.
    reply.raw.once('close', () => void release(request))
    const declared = request.headers['content-length']
    if (declared !== undefined) {
      const bytes = Math.min(Number(declared) || 0, largestBodyBytes)
      budget.take(tenantId, bytes)
      h.bytes = bytes
      return payload
    }
    if (request.headers['transfer-encoding'] === undefined) return payload
    const counted = new Transform({
      transform(chunk: Buffer, _encoding, done: TransformCallback) {
        try {
          budget.take(tenantId, chunk.length)
        } catch (error) {
          done(error as Error)
          return
        }
        h.bytes += chunk.length
        done(null, chunk)
      },
    })
    payload.on('error', (error) => counted.destroy(error))
    const stream = payload.pipe(counted) as Transform & { receivedEncodedLength?: number }
    payload.on('data', (chunk: Buffer) => {
      stream.receivedEncodedLength = (stream.receivedEncodedLength ?? 0) + chunk.length
    })
    return stream
  })
  app.addHook('onResponse', release)
  app.addHook('onRequestAbort', release)
}
