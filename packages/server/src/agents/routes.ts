import {
  AgentDetailSchema,
  AgentListSchema,
  CairnProblem,
  DeployResultSchema,
  ErrorBodySchema,
  IdParams,
  OkSchema,
} from '@cairn/protocol'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf, requireWrite } from '../auth/plugin.js'
import type { AgentService } from './agent-service.js'

const errors = { 400: ErrorBodySchema, 401: ErrorBodySchema, 404: ErrorBodySchema }

export function agentRoutes(app: FastifyInstance, agents: AgentService): void {
  app.post(
    '/v1/agents',
    {
      schema: {
        tags: ['agents'],
        summary: 'Deploy a project archive (tar.gz with cairn.yaml at its root) as a new revision',
        querystring: Type.Object({ name: Type.Optional(Type.String({ maxLength: 63 })) }),
        consumes: ['application/gzip'],
        response: { 201: DeployResultSchema, ...errors, 413: ErrorBodySchema },
      },
    },
    async (request, reply) => {
      const { tenantId } = requireWrite(request)
      if (!Buffer.isBuffer(request.body)) {
        throw new CairnProblem(
          'unsupported_media_type',
          'send the project as a tar.gz body (Content-Type: application/gzip)',
        )
      }
      const { name } = request.query as { name?: string }
      const result = await agents.deploy(tenantId, request.body, name)
      return reply.status(201).send(result)
    },
  )

  app.get(
    '/v1/agents',
    {
      schema: {
        tags: ['agents'],
        summary: 'List agents',
        response: { 200: AgentListSchema, 401: ErrorBodySchema },
      },
    },
    async (request) => ({ data: agents.list(principalOf(request).tenantId) }),
  )

  app.get(
    '/v1/agents/:id',
    {
      schema: {
        tags: ['agents'],
        summary: 'Get an agent (by ID or name) with its revisions',
        params: IdParams,
        response: { 200: AgentDetailSchema, ...errors },
      },
    },
    async (request) => agents.get(principalOf(request).tenantId, (request.params as { id: string }).id),
  )

  app.delete(
    '/v1/agents/:id',
    {
      schema: {
        tags: ['agents'],
        summary: 'Delete an agent',
        params: IdParams,
        response: { 200: OkSchema, ...errors },
      },
    },
    async (request) => {
      agents.delete(requireWrite(request).tenantId, (request.params as { id: string }).id)
      return { ok: true }
    },
  )
}
