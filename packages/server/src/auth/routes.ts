import { ApiKeyListSchema, CairnProblem, CreatedApiKeySchema, OkSchema } from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { errorResponses } from '../http/responses.js'
import { type ApiKeyStore, DEFAULT_TENANT_ID } from './api-keys.js'
import { principalOf } from './plugin.js'

const CreateKeyBody = Type.Object(
  {
    tenant: Type.Optional(Type.String({ minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9_.-]+$' })),
    role: Type.Optional(Type.Union([Type.Literal('admin'), Type.Literal('read')])),
    name: Type.Optional(Type.String({ maxLength: 100 })),
  },
  { additionalProperties: false },
)
const errors = errorResponses(400, 401, 403, 404, 409)

function requireAdmin(request: FastifyRequest) {
  const principal = principalOf(request)
  if (principal.role !== 'admin') throw new CairnProblem('forbidden', 'managing API keys needs an admin key')
  return principal
}

/** API keys: admins create (the key is shown once), list (prefix only) and revoke them. */
export function keyRoutes(
  server: FastifyInstance,
  keys: ApiKeyStore,
  limits: { maxKeysPerTenant: number },
): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.post(
    '/v1/keys',
    {
      schema: {
        tags: ['keys'],
        summary: 'Create an API key (for this tenant, or for another one when called by an install admin)',
        body: CreateKeyBody,
        response: {
          201: CreatedApiKeySchema,
          ...errors,
        },
      },
    },
    async (request, reply) => {
      const principal = requireAdmin(request)
      const body = request.body
      let tenantId = principal.tenantId
      if (body.tenant !== undefined) {
        const wanted = await keys.tenantByNameIfExists(body.tenant)
        if (wanted !== principal.tenantId) {
          if (principal.tenantId !== DEFAULT_TENANT_ID) {
            throw new CairnProblem(
              'forbidden',
              'only the install admin (default tenant) creates keys for other tenants',
            )
          }
          tenantId = wanted ?? (await keys.tenantByName(body.tenant))
        }
      }
      const role = body.role ?? 'admin'
      const created = await keys.createWithin(tenantId, role, limits.maxKeysPerTenant, body.name)
      return reply.status(201).send({ ...created, tenantId, role })
    },
  )
  app.get(
    '/v1/keys',
    {
      schema: {
        tags: ['keys'],
        summary: "List this tenant's keys (prefix only)",
        response: { 200: ApiKeyListSchema, ...errors },
      },
    },
    async (request) => ({ data: await keys.list(requireAdmin(request).tenantId) }),
  )
  app.delete(
    '/v1/keys/:id',
    {
      schema: {
        tags: ['keys'],
        summary: 'Revoke a key',
        params: Type.Object({ id: Type.String() }),
        response: { 200: OkSchema, ...errors },
      },
    },
    async (request) => {
      const principal = requireAdmin(request)
      const id = request.params.id
      if (!(await keys.revoke(principal.tenantId, id)))
        throw new CairnProblem('not_found', `No active key ${id}`)
      return { ok: true }
    },
  )
}
