import { RetentionPolicySchema as PolicySchema, UsageSchema } from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf, requireWrite } from '../auth/plugin.js'
import { errorResponses } from '../http/responses.js'
import type { RetentionService } from './retention-service.js'

const errors = errorResponses(400, 401, 403)

export function retentionRoutes(server: FastifyInstance, retention: RetentionService): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.get(
    '/v1/retention',
    {
      schema: {
        tags: ['usage'],
        summary: "The tenant's retention policy",
        response: { 200: PolicySchema, ...errors },
      },
    },
    async (request) => await retention.policy(principalOf(request).tenantId),
  )
  app.put(
    '/v1/retention',
    {
      schema: {
        tags: ['usage'],
        summary: 'Change the retention policy (keep-last-N automatic snapshots, TTLs for ended sessions)',
        body: Type.Partial(PolicySchema, { additionalProperties: false }),
        response: { 200: PolicySchema, ...errors },
      },
    },
    async (request) => await retention.setPolicy(requireWrite(request).tenantId, request.body),
  )
  app.get(
    '/v1/usage',
    {
      schema: {
        tags: ['usage'],
        summary:
          'Sessions by status, snapshots, pool space, bytes freed by retention (and storage per session with ?storage=true)',
        querystring: Type.Object({ storage: Type.Optional(Type.Boolean()) }),
        response: { 200: UsageSchema, ...errors },
      },
    },
    async (request) => retention.usage(principalOf(request).tenantId, request.query.storage === true),
  )
}
