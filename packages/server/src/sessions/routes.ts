import {
  AgentMessageBody,
  CairnProblem,
  CreateSessionBody,
  IdParams,
  ListSessionsQuery,
  MessageListSchema,
  NetworkEventSchema,
  OkSchema,
  ResumeBody,
  SendMessageBody,
  type SessionInfo,
  SessionLeaseSchema,
  SessionListSchema,
  SessionSchema,
  StatusEventSchema,
  TurnEventsQuery,
  TurnParams,
  TurnSchema,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf, requireWrite } from '../auth/plugin.js'
import { errorResponses, eventStreamResponse, TURN_ID_HEADER } from '../http/responses.js'
import { eventIdAfter, SseWriter, type SseWriterOptions } from '../http/sse.js'
import type { SessionService } from './session-service.js'

const errors = errorResponses(400, 401, 404, 409, 410)
const idOf = (request: { params: { id: string } }) => request.params.id

export function sessionRoutes(
  server: FastifyInstance,
  sessions: SessionService,
  sse: SseWriterOptions = {},
): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.post(
    '/v1/sessions',
    {
      schema: {
        tags: ['sessions'],
        summary: 'Create a session of an agent (a writable snapshot of its current revision)',
        body: CreateSessionBody,
        response: { 201: SessionSchema, ...errors },
      },
    },
    async (request, reply) => {
      const info = await sessions.create(requireWrite(request).tenantId, request.body)
      return reply.status(201).send(info)
    },
  )

  app.get(
    '/v1/sessions',
    {
      schema: {
        tags: ['sessions'],
        summary: 'List sessions, newest first',
        querystring: ListSessionsQuery,
        response: { 200: SessionListSchema, ...errors },
      },
    },
    async (request) => sessions.list(principalOf(request).tenantId, request.query),
  )

  app.get(
    '/v1/sessions/resolve',
    {
      schema: {
        tags: ['sessions'],
        summary: 'Resolve a unique session ID prefix',
        querystring: Type.Object({ prefix: Type.String({ minLength: 1, maxLength: 64 }) }),
        response: { 200: SessionSchema, ...errors },
      },
    },
    async (request) => sessions.resolve(principalOf(request).tenantId, request.query.prefix),
  )

  app.get(
    '/v1/sessions/:id',
    {
      schema: {
        tags: ['sessions'],
        summary: 'Get a session',
        params: IdParams,
        response: { 200: SessionSchema, ...errors },
      },
    },
    async (request) => sessions.get(principalOf(request).tenantId, idOf(request)),
  )

  app.get(
    '/v1/sessions/:id/messages',
    {
      schema: {
        tags: ['sessions'],
        summary: 'The transcript',
        params: IdParams,
        response: { 200: MessageListSchema, ...errors },
      },
    },
    async (request) => ({ data: await sessions.messages(principalOf(request).tenantId, idOf(request)) }),
  )

  app.get(
    '/v1/sessions/:id/events',
    {
      schema: {
        tags: ['sessions'],
        summary: 'Every status change with its cause',
        params: IdParams,
        response: { 200: Type.Object({ data: Type.Array(StatusEventSchema) }), ...errors },
      },
    },
    async (request) => ({ data: await sessions.events(principalOf(request).tenantId, idOf(request)) }),
  )

  app.get(
    '/v1/sessions/:id/network',
    {
      schema: {
        tags: ['sessions'],
        summary: 'Every egress connection the session attempted, allowed or denied',
        params: IdParams,
        response: { 200: Type.Object({ data: Type.Array(NetworkEventSchema) }), ...errors },
      },
    },
    async (request) => ({ data: await sessions.network(principalOf(request).tenantId, idOf(request)) }),
  )

  app.get(
    '/v1/sessions/:id/turns',
    {
      schema: {
        tags: ['sessions'],
        summary: 'Turns with their status, timing and stderr log',
        params: IdParams,
        response: { 200: Type.Object({ data: Type.Array(TurnSchema) }), ...errors },
      },
    },
    async (request) => ({ data: await sessions.turns(principalOf(request).tenantId, idOf(request)) }),
  )

  app.get(
    '/v1/sessions/:id/turns/:turnId/events',
    {
      schema: {
        tags: ['sessions'],
        summary:
          "A turn's event stream picked up again, through any replica: the events after Last-Event-ID (or `after`), then the live ones until the turn ends; 204 when the turn ended and the client has its last event",
        params: TurnParams,
        querystring: TurnEventsQuery,
        headers: Type.Object({
          'last-event-id': Type.Optional(
            Type.String({
              maxLength: 32,
              description: 'The id of the last event received (wins over `after`)',
            }),
          ),
        }),
        response: {
          200: eventStreamResponse("The turn's events after the one named"),
          204: {
            description: 'The turn ended and its last event is at or before the one named: nothing follows',
          },
          ...errors,
        },
      },
    },
    async (request, reply) => {
      const { tenantId } = principalOf(request)
      const after = eventIdAfter(request.headers['last-event-id'], request.query.after)
      const replay = await sessions.replayTurn(tenantId, idOf(request), request.params.turnId, after)
      if (!replay) return reply.status(204).send()
      reply.hijack()
      const writer = new SseWriter(reply.raw, sse)
      const stop = new AbortController()
      writer.onClose(() => stop.abort())
      try {
        await replay.stream(({ id, event }) => writer.send(event, id), stop.signal)
      } finally {
        writer.end()
      }
    },
  )

  app.post(
    '/v1/sessions/:id/messages',
    {
      schema: {
        tags: ['sessions'],
        summary: 'Send a message; the answer is an SSE stream of the run',
        params: IdParams,
        body: SendMessageBody,
        response: { 200: eventStreamResponse('The run, as it happens', TURN_ID_HEADER), ...errors },
      },
    },
    async (request, reply) => {
      const { tenantId } = requireWrite(request)
      const handle = await sessions.startTurn(tenantId, idOf(request), request.body.prompt)
      reply.raw.setHeader('cairn-turn-id', handle.turnId)
      reply.hijack()
      const writer = new SseWriter(reply.raw, sse)
      try {
        await handle.run((event, id) => writer.send(event, id))
      } finally {
        writer.end()
      }
    },
  )

  app.post(
    '/v1/messages',
    {
      schema: {
        tags: ['sessions'],
        summary:
          'Send a message to an agent: in sessionId, or in a new session created for it (the options of POST /v1/sessions); the answer is an SSE stream of the run, whose run.started event and Cairn-Session-Id header name the session',
        body: AgentMessageBody,
        response: {
          200: eventStreamResponse('The run, as it happens (the Cairn-Session-Id header names its session)', {
            ...TURN_ID_HEADER,
            'Cairn-Session-Id': { type: 'string', description: 'The session the message ran in' },
          }),
          ...errors,
        },
      },
    },
    async (request, reply) => {
      const { tenantId } = requireWrite(request)
      const { prompt, sessionId, ...create } = request.body
      let id: string
      if (sessionId === undefined) {
        id = (await sessions.create(tenantId, create)).id
      } else {
        const given = Object.keys(create).filter((k) => k !== 'agent')
        if (given.length > 0)
          throw new CairnProblem(
            'validation_failed',
            `'${given[0]}' applies to a new session, not to an existing one (sessionId); change a session's policy with POST /v1/sessions/{id}/resume`,
          )
        const info = await sessions.get(tenantId, sessionId)
        if (info.agentId !== create.agent && info.agentName !== create.agent)
          throw new CairnProblem(
            'validation_failed',
            `session ${info.id} belongs to agent ${info.agentName}, not ${create.agent}`,
          )
        id = info.id
      }
      const handle = await sessions.startTurn(tenantId, id, prompt)
      reply.raw.setHeader('cairn-session-id', id)
      reply.raw.setHeader('cairn-turn-id', handle.turnId)
      reply.hijack()
      const writer = new SseWriter(reply.raw, sse)
      try {
        await handle.run((event, id) => writer.send(event, id))
      } finally {
        writer.end()
      }
    },
  )

  const action = (
    path: string,
    summary: string,
    run: (tenantId: string, id: string) => Promise<SessionInfo | { ok: boolean }>,
  ) =>
    app.post(
      `/v1/sessions/:id/${path}`,
      {
        schema: {
          tags: ['sessions'],
          summary,
          params: IdParams,
          response: { 200: path === 'cancel' ? OkSchema : SessionSchema, ...errors },
        },
      },
      async (request) => run(requireWrite(request).tenantId, idOf(request)),
    )
  action('end', 'End a session (its workspace is kept; it can be resumed)', (t, id) => sessions.end(t, id))
  app.post(
    '/v1/sessions/:id/resume',
    {
      schema: {
        tags: ['sessions'],
        summary:
          'Resume an ended, failed or timed-out session (workspace checked against its generation), optionally changing its lifecycle policy',
        params: IdParams,
        // Optional (see http/optional-body.ts): a bare POST resumes without changing the policy.
        body: ResumeBody,
        response: { 200: SessionSchema, ...errors, ...errorResponses(500) },
      },
    },
    async (request) => sessions.resume(requireWrite(request).tenantId, idOf(request), request.body.policy),
  )
  action('cancel', 'Cancel the running turn', async (t, id) => ({ ok: await sessions.cancel(t, id) }))

  app.post(
    '/v1/sessions/:id/lease',
    {
      schema: {
        tags: ['sessions'],
        summary: 'Hold the session active for ttlMs (no idle timeout, sandbox kept warm)',
        params: IdParams,
        body: Type.Object(
          { ttlMs: Type.Integer({ minimum: 1000, maximum: 24 * 3600 * 1000 }) },
          { additionalProperties: false },
        ),
        response: { 200: SessionLeaseSchema, ...errors },
      },
    },
    async (request) => sessions.lease(requireWrite(request).tenantId, idOf(request), request.body.ttlMs),
  )

  app.delete(
    '/v1/sessions/:id',
    {
      schema: {
        tags: ['sessions'],
        summary: 'Delete a session and its workspace',
        params: IdParams,
        response: { 200: OkSchema, ...errors },
      },
    },
    async (request) => {
      await sessions.delete(requireWrite(request).tenantId, idOf(request))
      return { ok: true }
    },
  )
}
