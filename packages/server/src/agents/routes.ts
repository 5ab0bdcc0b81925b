import {
  AgentDetailSchema,
  AgentListSchema,
  BuildLogEventSchema,
  BuildLogSchema,
  CairnProblem,
  DeployResultSchema,
  IdParams,
  OkSchema,
  RevisionSchema,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf, requireWrite } from '../auth/plugin.js'
import { bytesBody, errorResponses, eventStreamMedia } from '../http/responses.js'
import { eventIdAfter, SseWriter, type SseWriterOptions } from '../http/sse.js'
import { type AgentService, revisionInfo } from './agent-service.js'
import { followBuildLog } from './build-log-stream.js'

const errors = errorResponses(400, 401, 404)

export function agentRoutes(server: FastifyInstance, agents: AgentService, sse: SseWriterOptions = {}): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.post(
    '/v1/agents',
    {
      schema: {
        tags: ['agents'],
        summary: 'Deploy a project archive (tar.gz with cairn.yaml at its root) as a new revision',
        querystring: Type.Object({
          name: Type.Optional(Type.String({ maxLength: 63 })),
          wait: Type.Optional(Type.Boolean({ description: 'wait for the build to finish before answering' })),
        }),
        body: bytesBody(['application/gzip'], 'The project as a tar.gz archive'),
        response: { 201: DeployResultSchema, ...errors, ...errorResponses(413, 415, 422) },
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
      const { name, wait } = request.query
      const result = await agents.deploy(tenantId, request.body, {
        ...(name === undefined ? {} : { name }),
        ...(wait === undefined ? {} : { wait }),
      })
      return reply.status(201).send(result)
    },
  )

  app.get(
    '/v1/agents',
    {
      schema: {
        tags: ['agents'],
        summary: 'List agents',
        response: { 200: AgentListSchema, ...errorResponses(401) },
      },
    },
    async (request) => ({ data: await agents.list(principalOf(request).tenantId) }),
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
    async (request) => await agents.get(principalOf(request).tenantId, request.params.id),
  )

  const RevisionParams = Type.Object({ id: Type.String(), rev: Type.String() })
  app.get(
    '/v1/agents/:id/revisions/:rev',
    {
      schema: {
        tags: ['agents'],
        summary: 'Get a revision',
        params: RevisionParams,
        response: { 200: RevisionSchema, ...errors },
      },
    },
    async (request) => {
      const { id, rev } = request.params
      return revisionInfo(await agents.revisionOf(principalOf(request).tenantId, id, rev))
    },
  )

  app.get(
    '/v1/agents/:id/revisions/:rev/logs',
    {
      schema: {
        tags: ['agents'],
        summary: 'Build log of a revision; with ?follow=true an SSE stream (log, end) while it builds',
        params: RevisionParams,
        querystring: Type.Object({ follow: Type.Optional(Type.Boolean()) }),
        headers: Type.Object({
          'last-event-id': Type.Optional(
            Type.String({
              maxLength: 32,
              description: 'With follow=true: the id of the last event received',
            }),
          ),
        }),
        response: {
          200: {
            description: 'The log so far (JSON), or with follow=true an event stream of it',
            content: {
              'application/json': { schema: BuildLogSchema },
              'text/event-stream': eventStreamMedia(BuildLogEventSchema),
            },
          },
          204: {
            description:
              'With follow=true and Last-Event-ID at or after the end of a finished build: nothing follows',
          },
          ...errors,
        },
      },
    },
    async (request, reply) => {
      const { id, rev } = request.params
      const revision = await agents.revisionOf(principalOf(request).tenantId, id, rev)
      const follow = request.query.follow === true
      if (!follow)
        return { status: revision.status, error: revision.error, lines: await agents.logs.read(rev) }
      const after = eventIdAfter(request.headers['last-event-id'], undefined)
      // A build over, whose end the client has (an EventSource reconnecting after it): 204, so
      // that it stops instead of replaying the log forever.
      if (after > 0 && !agents.logs.isLive(rev) && after > (await agents.logs.read(rev)).length)
        return reply.status(204).send()
      reply.hijack()
      const writer = new SseWriter(reply.raw, { heartbeatMs: sse.heartbeatMs })
      await followBuildLog(agents, rev, revision, after, writer).catch((error: unknown) =>
        request.log.warn({ err: error, revision: rev }, 'reading a build log for a follower failed'),
      )
      writer.end()
    },
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
      await agents.delete(requireWrite(request).tenantId, request.params.id)
      return { ok: true }
    },
  )
}
