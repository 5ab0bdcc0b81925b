import { ArtifactListSchema, ArtifactSchema, IdParams, MAX_EXACT_INTEGER } from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance } from 'fastify'
import type { AgentService } from '../agents/agent-service.js'
import { principalOf, requireWrite } from '../auth/plugin.js'
import { workspaceRelative } from '../files/confine.js'
import { bytesResponse, errorResponses } from '../http/responses.js'
import type { SessionService } from '../sessions/session-service.js'
import type { ArtifactStore } from './artifact-store.js'
import { MAX_MEMORY_BYTES, type MemoryService } from './memory-service.js'

const MemorySchema = Type.Object({
  agentId: Type.String(),
  version: Type.Integer(),
  content: Type.String(),
  source: Type.String(),
  updatedAt: Type.Union([Type.String(), Type.Null()]),
})
const errors = errorResponses(400, 401, 403, 404, 409, 410)
const ArtifactParams = Type.Object({ id: Type.String(), artifactId: Type.String() })
const idOf = (request: { params: { id: string } }) => request.params.id

export function memoryRoutes(
  server: FastifyInstance,
  memory: MemoryService,
  artifacts: ArtifactStore,
  agents: AgentService,
  sessions: SessionService,
): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  const tags = ['memory']
  app.get(
    '/v1/agents/:id/memory',
    {
      schema: {
        tags,
        summary: "The agent's memory (mounted read-only at /memory in new sandboxes)",
        params: IdParams,
        response: { 200: MemorySchema, ...errors },
      },
    },
    async (request) =>
      await memory.get((await agents.require(principalOf(request).tenantId, idOf(request))).id),
  )
  app.put(
    '/v1/agents/:id/memory',
    {
      schema: {
        tags,
        summary: 'Replace the memory with a new version (baseVersion guards against lost updates)',
        params: IdParams,
        body: Type.Object(
          {
            content: Type.String({ maxLength: MAX_MEMORY_BYTES }),
            baseVersion: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_EXACT_INTEGER })),
          },
          { additionalProperties: false },
        ),
        response: { 200: MemorySchema, ...errors },
      },
    },
    async (request) => {
      const agent = await agents.require(requireWrite(request).tenantId, idOf(request))
      const body = request.body
      return await memory.put(agent.id, body.content, 'api', body.baseVersion)
    },
  )
  app.post(
    '/v1/sessions/:id/memory/promote',
    {
      schema: {
        tags,
        summary: 'Promote /workspace/.cairn/memory.proposed.md to the agent memory',
        params: IdParams,
        response: { 200: MemorySchema, ...errors },
      },
    },
    async (request) => {
      const { tenantId } = requireWrite(request)
      const row = await sessions.requireOwned(tenantId, idOf(request))
      const promoted = await sessions.readingWorkspace(tenantId, row.id, () =>
        memory.promoteProposed(row.agent_id, row.id, `${row.id}/api`),
      )
      return promoted ?? (await memory.get(row.agent_id))
    },
  )
  app.post(
    '/v1/sessions/:id/artifacts',
    {
      schema: {
        tags,
        summary:
          "Copy a workspace file into the agent's artifact store (kept after the session is deleted; counts in the tenant's storage quota until deleted)",
        params: IdParams,
        body: Type.Object(
          { path: Type.String({ minLength: 1, maxLength: 4096 }) },
          { additionalProperties: false },
        ),
        response: { 201: ArtifactSchema, ...errors, ...errorResponses(507) },
      },
    },
    async (request, reply) => {
      const { tenantId } = requireWrite(request)
      const row = await sessions.requireLive(tenantId, idOf(request))
      const rel = workspaceRelative(request.body.path)
      const info = await sessions.readingWorkspace(tenantId, row.id, () =>
        artifacts.save({ tenantId, agentId: row.agent_id, sessionId: row.id }, rel),
      )
      return reply.status(201).send(info)
    },
  )
  app.get(
    '/v1/agents/:id/artifacts',
    {
      schema: {
        tags,
        summary: "The agent's artifacts",
        params: IdParams,
        response: { 200: ArtifactListSchema, ...errors },
      },
    },
    async (request) => ({
      data: await artifacts.list((await agents.require(principalOf(request).tenantId, idOf(request))).id),
    }),
  )
  app.get(
    '/v1/agents/:id/artifacts/:artifactId',
    {
      schema: {
        tags,
        summary: 'Download an artifact',
        params: ArtifactParams,
        response: { 200: bytesResponse('application/octet-stream', 'The artifact'), ...errors },
      },
    },
    async (request, reply) => {
      const agent = await agents.require(principalOf(request).tenantId, idOf(request))
      const { artifactId } = request.params
      const { info } = await artifacts.file(agent.id, artifactId)
      const body = await artifacts.read(agent.id, artifactId)
      void reply.header(
        'content-disposition',
        `attachment; filename="${encodeURIComponent(info.path.split('/').pop() ?? 'artifact')}"`,
      )
      return reply.type('application/octet-stream').send(body)
    },
  )
  app.delete(
    '/v1/agents/:id/artifacts/:artifactId',
    {
      schema: {
        tags,
        summary: "Delete an artifact: its bytes leave the data disk and the tenant's storage quota",
        params: ArtifactParams,
        response: { 200: ArtifactSchema, ...errors },
      },
    },
    async (request) => {
      const agent = await agents.require(requireWrite(request).tenantId, idOf(request))
      return await artifacts.delete(agent.id, request.params.artifactId)
    },
  )
}
