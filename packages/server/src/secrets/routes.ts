import { IdParams, OkSchema, SecretListSchema } from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import type { AgentService } from '../agents/agent-service.js'
import { principalOf, requireWrite } from '../auth/plugin.js'
import { errorResponses } from '../http/responses.js'
import { SECRET_SCOPES, type SecretStore } from './secret-store.js'

const errors = errorResponses(400, 401, 404)
const SetSecretsBody = Type.Object(
  {
    secrets: Type.Record(Type.String({ maxLength: 128 }), Type.String({ maxLength: 65536 })),
    scope: Type.Optional(Type.Union(SECRET_SCOPES.map((s) => Type.Literal(s)))),
    /** `proxy` scope: hosts (allowlist syntax) whose requests get the value in place of the stand-in. */
    hosts: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 260 }), { maxItems: 32 })),
    /**
     * `proxy` scope: request headers the value is swapped into besides the credential headers
     * (`Authorization`, `Proxy-Authorization`, `X-Api-Key`, …); never other headers, URLs or bodies.
     */
    headers: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 64 }), { maxItems: 16 })),
    /**
     * When these secrets expire (an ISO 8601 time in the future): from then on they are no longer
     * injected, and the next retention pass deletes them. Absent or null: they never expire (a
     * secret set again without it loses its former expiry).
     */
    expiresAt: Type.Optional(Type.Union([Type.String({ minLength: 1, maxLength: 64 }), Type.Null()])),
  },
  { additionalProperties: false },
)

export function secretRoutes(server: FastifyInstance, agents: AgentService, secrets: SecretStore): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  const agentOf = async (request: FastifyRequest & { params: { id: string } }, write: boolean) => {
    const { tenantId } = write ? requireWrite(request) : principalOf(request)
    return await agents.require(tenantId, request.params.id)
  }
  const listing = async (agentId: string) => ({
    data: await secrets.list(agentId),
    missing: await secrets.missing(agentId, await agents.requiredSecrets(agentId)),
  })

  app.get(
    '/v1/agents/:id/secrets',
    {
      schema: {
        tags: ['secrets'],
        summary: 'Secret names of an agent (values are never returned) and required ones still missing',
        params: IdParams,
        response: { 200: SecretListSchema, ...errors },
      },
    },
    async (request) => listing((await agentOf(request, false)).id),
  )

  app.put(
    '/v1/agents/:id/secrets',
    {
      schema: {
        tags: ['secrets'],
        summary: 'Set secrets (encrypted at rest); scope runtime (default), setup or proxy (with hosts)',
        params: IdParams,
        body: SetSecretsBody,
        response: { 200: SecretListSchema, ...errors },
      },
    },
    async (request) => {
      const agent = await agentOf(request, true)
      const body = request.body
      const current = await agents.currentNetwork(agent.id)
      await secrets.set(agent.tenant_id, agent.id, body.secrets, {
        scope: body.scope,
        hosts: body.hosts,
        headers: body.headers,
        expiresAt: body.expiresAt ?? null,
        // Refused rather than accepted with a warning: the secret could never be used, and a
        // warning in the listing would go unseen by every client that only checks the status.
        allowlist: current && {
          network: current.network,
          where: `network.allow of the agent's current revision (${current.revisionId})`,
        },
      })
      return listing(agent.id)
    },
  )

  app.delete(
    '/v1/agents/:id/secrets/:name',
    {
      schema: {
        tags: ['secrets'],
        summary: 'Delete a secret',
        params: Type.Object({ id: Type.String(), name: Type.String() }),
        response: { 200: OkSchema, ...errors },
      },
    },
    async (request) => {
      const agent = await agentOf(request, true)
      return { ok: await secrets.delete(agent.id, request.params.name) }
    },
  )
}
