import { CairnProblem } from '@cairn/protocol'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import type { ApiKeyStore, Principal } from './api-keys.js'

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal | undefined
  }
}

/** Bearer authentication on everything under /v1 (the OpenAPI document excepted). */
export function installAuth(app: FastifyInstance, keys: ApiKeyStore): void {
  app.decorateRequest('principal', undefined)
  app.addHook('onRequest', async (request) => {
    const url = request.url
    if (!url.startsWith('/v1/') && url !== '/v1') return
    if (url === '/v1/openapi.json') return
    const header = request.headers.authorization
    const match = header ? /^Bearer\s+(\S+)$/i.exec(header) : null
    if (!match?.[1])
      throw new CairnProblem('unauthorized', 'missing API key: send Authorization: Bearer <key>')
    const principal = keys.verify(match[1])
    if (!principal) throw new CairnProblem('unauthorized', 'invalid API key')
    request.principal = principal
  })
}

export function principalOf(request: FastifyRequest): Principal {
  if (!request.principal) throw new CairnProblem('unauthorized', 'missing API key')
  return request.principal
}

export function requireWrite(request: FastifyRequest): Principal {
  const principal = principalOf(request)
  if (principal.role === 'read') throw new CairnProblem('forbidden', 'this API key is read-only')
  return principal
}
