import type { Readable } from 'node:stream'
import { CairnProblem, ErrorBodySchema, type StreamEvent } from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { AgentService } from '../agents/agent-service.js'
import type { ArchiveLimits } from '../agents/archive.js'
import type { ApiKeyStore, Principal } from '../auth/api-keys.js'
import type { RateLimits } from '../auth/plugin.js'
import { toErrorBody } from '../http/errors.js'
import { bytesBody, EVENT_DATA_EXTENSION } from '../http/responses.js'
import { DEFAULT_SSE_STALL_MS, whenDrained } from '../http/sse.js'
import type { SecretStore } from '../secrets/secret-store.js'
import type { SessionService } from '../sessions/session-service.js'
import { deployForm, readDeployForm } from './deploy.js'
import {
  CompatAgentListSchema,
  CompatAgentSchema,
  CompatCreateSessionBody,
  CompatDeletedSchema,
  CompatErrorSchema,
  CompatIdsSchema,
  CompatListSessionsQuery,
  CompatResolveQuery,
  CompatRunEventSchema,
  CompatSecretKeysSchema,
  CompatSecretsBody,
  CompatSendMessageBody,
  CompatSendMessageQuery,
  CompatSessionListSchema,
  CompatSessionSchema,
  type CompatStreamFormat,
  CompatUserSchema,
  CompatValidationSchema,
} from './schemas.js'
import { cairnStatus, encodeCompatSse, RunEventMapper, toCompatAgent, toCompatSession } from './translate.js'

export interface CompatDeps {
  keys: ApiKeyStore
  agents: AgentService
  sessions: SessionService
  secrets: SecretStore
  archiveLimits: ArchiveLimits
  maxUploadBytes: number
  /** Cairn's own budgets: a key's and its tenant's are the same through /v1 and the compat API. */
  rateLimits: RateLimits
}

const HEARTBEAT_MS = 15_000
const MAX_TITLE_CHARS = 200
const IdParams = Type.Object({ id: Type.String({ minLength: 1, maxLength: 200 }) })
const errors = {
  ...Object.fromEntries(
    [400, 401, 403, 404, 409, 410, 413, 415, 422, 429, 500, 503, 507].map((s) => [s, CompatErrorSchema]),
  ),
  // Refused by the HTTP parser before any route is known (a request too slow, headers too large):
  // in the registry's own shape, as on every route.
  408: ErrorBodySchema,
  431: ErrorBodySchema,
}

/**
 * A run's stream: each event's data is its member's `data` (format `events`, the default) or the
 * whole `{type, data}` (format `envelope`), by the event's name.
 */
const runStream = {
  description: "The run's events as server-sent events (see CompatRunEventSchema)",
  content: {
    'text/event-stream': {
      schema: Type.String({ description: 'Server-sent events (text/event-stream), read event by event' }),
      [EVENT_DATA_EXTENSION]: Type.Union(
        CompatRunEventSchema.anyOf.map((event) =>
          Type.Union([event.properties.data, event], { title: event.properties.type.const }),
        ),
      ),
    },
  },
}

/**
 * The hosted product's agent-session API (as its own SDK and CLI speak it), translated onto
 * Cairn's services. Registered under a prefix (`--compat-prefix`); clients use `<prefix>/v1/…`.
 * Routes are in Cairn's OpenAPI document under the prefix (tag `compat`), typed by the schemas in
 * schemas.ts, so the document-driven tenant sweep covers them.
 */
export async function compatRoutes(server: FastifyInstance, deps: CompatDeps): Promise<void> {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  const principals = new WeakMap<FastifyRequest, Principal>()

  app.setErrorHandler((error, request, reply) => {
    const { status, body } = toErrorBody(error, request.id)
    if (status >= 500) request.log.error({ err: error }, 'compat request failed')
    void reply.status(status).send(compatError(body.error, request.id))
  })
  // A path no route has (404) or a method its path does not take (405 with Allow) is answered by
  // the server's own not-found handler, in this API's shape (see compatErrorShape).
  // The deploy form is left unread here: its route reads it as it streams in (compat/deploy.ts),
  // from the body stream the server's body budget counts.
  const forms = new WeakMap<FastifyRequest, Readable>()
  app.addContentTypeParser('multipart/form-data', (request, payload, done) => {
    forms.set(request, payload)
    done(null, undefined)
  })
  // Cairn's bearer keys, on every compat route: their CLI sends the key it stored at login.
  app.addHook('onRequest', async (request) => {
    const match = /^Bearer\s+(\S+)$/i.exec(request.headers.authorization ?? '')
    if (!match?.[1])
      throw new CairnProblem('unauthorized', 'missing API key: send Authorization: Bearer <key>')
    const principal = await deps.keys.verify(match[1])
    if (!principal) throw new CairnProblem('unauthorized', 'invalid API key')
    deps.rateLimits.admit(principal)
    principals.set(request, principal)
    // What the server's own hooks read (the body budget counts a request's body for its tenant).
    request.principal = principal
  })
  const reader = (request: FastifyRequest): Principal => {
    const principal = principals.get(request)
    if (!principal) throw new CairnProblem('unauthorized', 'missing API key')
    return principal
  }
  const writer = (request: FastifyRequest): Principal => {
    const principal = reader(request)
    if (principal.role === 'read') throw new CairnProblem('forbidden', 'this API key is read-only')
    return principal
  }
  const agentOut = async (tenantId: string, idOrName: string) => {
    const detail = await deps.agents.get(tenantId, idOrName)
    return toCompatAgent(detail, {
      environmentKeys: (await deps.secrets.list(detail.id)).map((s) => s.name),
      requiredSecrets: await deps.agents.requiredSecrets(detail.id),
    })
  }
  const keysOf = async (agentId: string) => ({ keys: (await deps.secrets.list(agentId)).map((s) => s.name) })
  const schema = <S extends object>(s: S) => ({ tags: ['compat'], ...s })

  // ==================== auth ====================
  const user = (p: Principal) => ({ id: p.tenantId, email: p.keyId, full_name: null })
  app.get(
    '/v1/auth/validate',
    { schema: schema({ response: { 200: CompatValidationSchema, ...errors } }) },
    async (request) => ({
      valid: true,
      user: user(reader(request)),
    }),
  )
  app.get(
    '/v1/auth/me',
    { schema: schema({ response: { 200: CompatUserSchema, ...errors } }) },
    async (request) => user(reader(request)),
  )

  // ==================== agents ====================
  app.post(
    '/v1/agents',
    {
      schema: schema({
        summary: 'Deploy (their multipart form): the native deploy with a cairn.yaml made from the fields',
        body: bytesBody(
          ['multipart/form-data'],
          'Fields: file (the project tar.gz), name, command, config (JSON: mode, port, secrets, ignore, protocol)',
        ),
        response: { 201: CompatAgentSchema, ...errors },
      }),
    },
    async (request, reply) => {
      const { tenantId } = writer(request)
      const contentType = request.headers['content-type'] ?? ''
      if (!contentType.toLowerCase().startsWith('multipart/form-data')) {
        throw new CairnProblem(
          'unsupported_media_type',
          'send the deploy as multipart/form-data with the fields file, name, command and config',
        )
      }
      const body = forms.get(request) ?? request.raw
      const form = await readDeployForm(body, request.headers, deps.maxUploadBytes)
      const result = await deployForm(deps.agents, tenantId, form)
      return reply.status(201).send(await agentOut(tenantId, result.agent.id))
    },
  )
  app.get(
    '/v1/agents',
    { schema: schema({ response: { 200: CompatAgentListSchema, ...errors } }) },
    async (request) => {
      const { tenantId } = reader(request)
      return {
        agents: await Promise.all((await deps.agents.list(tenantId)).map((a) => agentOut(tenantId, a.id))),
      }
    },
  )
  app.get(
    '/v1/agents/:id',
    { schema: schema({ params: IdParams, response: { 200: CompatAgentSchema, ...errors } }) },
    async (request) => agentOut(reader(request).tenantId, request.params.id),
  )
  app.delete(
    '/v1/agents/:id',
    { schema: schema({ params: IdParams, response: { 200: CompatDeletedSchema, ...errors } }) },
    async (request) => {
      const { tenantId } = writer(request)
      const agent = await deps.agents.require(tenantId, request.params.id)
      await deps.agents.delete(tenantId, agent.id)
      return { id: agent.id, deleted: true as const }
    },
  )

  // ==================== secrets ====================
  app.get(
    '/v1/agents/:id/secrets',
    { schema: schema({ params: IdParams, response: { 200: CompatSecretKeysSchema, ...errors } }) },
    async (request) => keysOf((await deps.agents.require(reader(request).tenantId, request.params.id)).id),
  )
  app.patch(
    '/v1/agents/:id/secrets',
    {
      schema: schema({
        params: IdParams,
        body: CompatSecretsBody,
        response: { 200: CompatSecretKeysSchema, ...errors },
      }),
    },
    async (request) => {
      const { tenantId } = writer(request)
      const agent = await deps.agents.require(tenantId, request.params.id)
      const current = await deps.agents.currentNetwork(agent.id)
      await deps.secrets.set(tenantId, agent.id, request.body.secrets, {
        allowlist: current && {
          network: current.network,
          where: `network.allow of the agent's current revision (${current.revisionId})`,
        },
      })
      return keysOf(agent.id)
    },
  )
  app.delete(
    '/v1/agents/:id/secrets/:key',
    {
      schema: schema({
        params: Type.Object({
          id: Type.String({ minLength: 1, maxLength: 200 }),
          key: Type.String({ maxLength: 128 }),
        }),
        response: { 200: CompatSecretKeysSchema, ...errors },
      }),
    },
    async (request) => {
      const { tenantId } = writer(request)
      const agent = await deps.agents.require(tenantId, request.params.id)
      const key = request.params.key
      if (!(await deps.secrets.delete(agent.id, key))) {
        throw new CairnProblem('not_found', `agent ${agent.name} has no secret ${key}`)
      }
      return keysOf(agent.id)
    },
  )

  // ==================== sessions ====================
  app.post(
    '/v1/sessions',
    { schema: schema({ body: CompatCreateSessionBody, response: { 201: CompatSessionSchema, ...errors } }) },
    async (request, reply) => {
      const { tenantId } = writer(request)
      const body = request.body
      const info = await deps.sessions.create(tenantId, {
        agent: body.agent_id,
        // Their CLI titles a session with its first prompt, of any length; Cairn keeps 200 characters.
        ...(body.title == null ? {} : { title: [...body.title].slice(0, MAX_TITLE_CHARS).join('') }),
        // Theirs is in seconds, Cairn's in milliseconds (at least one second either way).
        ...(body.idle_timeout_seconds === undefined
          ? {}
          : { idleTimeoutMs: body.idle_timeout_seconds * 1000 }),
      })
      return reply.status(201).send(toCompatSession(info))
    },
  )
  app.get(
    '/v1/sessions',
    {
      schema: schema({
        querystring: CompatListSessionsQuery,
        response: { 200: CompatSessionListSchema, ...errors },
      }),
    },
    async (request) => {
      const { tenantId } = reader(request)
      const query = request.query
      const list = await deps.sessions.list(tenantId, {
        agent: query.agent_id,
        status: query.status === undefined ? undefined : cairnStatus(query.status),
        limit: query.limit ?? 500,
      })
      return { sessions: list.data.map(toCompatSession) }
    },
  )
  app.get(
    '/v1/sessions/resolve',
    { schema: schema({ querystring: CompatResolveQuery, response: { 200: CompatIdsSchema, ...errors } }) },
    async (request) => {
      const { tenantId } = reader(request)
      try {
        return {
          ids: [(await deps.sessions.resolve(tenantId, request.query.id_prefix)).id],
        }
      } catch (error) {
        // Their client decides on none or several itself (its own "No session found" and "Ambiguous ID").
        if (error instanceof CairnProblem && error.code === 'session_not_found') return { ids: [] }
        if (error instanceof CairnProblem && error.code === 'ambiguous_id') {
          return { ids: (error.details?.matches as string[] | undefined) ?? [] }
        }
        throw error
      }
    },
  )
  app.get(
    '/v1/sessions/:id',
    { schema: schema({ params: IdParams, response: { 200: CompatSessionSchema, ...errors } }) },
    async (request) => {
      const info = await deps.sessions.get(reader(request).tenantId, request.params.id)
      // Theirs: a deleted session is not found (Cairn keeps its row, with status deleted).
      if (info.status === 'deleted')
        throw new CairnProblem('session_not_found', `No session found matching '${info.id}'`)
      return toCompatSession(info)
    },
  )
  app.post(
    '/v1/sessions/:id/end',
    { schema: schema({ params: IdParams, response: { 200: CompatSessionSchema, ...errors } }) },
    async (request) => toCompatSession(await deps.sessions.end(writer(request).tenantId, request.params.id)),
  )
  app.post(
    '/v1/sessions/:id/resume',
    { schema: schema({ params: IdParams, response: { 200: CompatSessionSchema, ...errors } }) },
    async (request) =>
      toCompatSession(await deps.sessions.resume(writer(request).tenantId, request.params.id)),
  )
  app.delete(
    '/v1/sessions/:id',
    { schema: schema({ params: IdParams, response: { 200: CompatDeletedSchema, ...errors } }) },
    async (request) => {
      const id = request.params.id
      await deps.sessions.delete(writer(request).tenantId, id)
      return { id, deleted: true as const }
    },
  )
  app.post(
    '/v1/sessions/:id/messages',
    {
      schema: schema({
        params: IdParams,
        querystring: CompatSendMessageQuery,
        body: CompatSendMessageBody,
        response: { 200: runStream, ...errors },
      }),
    },
    async (request, reply) => {
      const { tenantId } = writer(request)
      const handle = await deps.sessions.startTurn(tenantId, request.params.id, request.body.prompt)
      await streamRun(reply, request.query.format ?? 'events', (send) => handle.run(send))
    },
  )
}

/** The hosted product's error shape for Cairn's error body (its code and message kept). */
export function compatError(
  error: { code: string; message: string; details?: Record<string, unknown> | undefined },
  requestId: string,
) {
  return {
    detail: error.message,
    message: error.message,
    code: error.code,
    request_id: requestId,
    ...(error.details === undefined ? {} : { details: error.details }),
  }
}

/** Writes a run as their SSE stream (framed as `format` says); stops writing (not running) when the client goes away. */
async function streamRun(
  reply: FastifyReply,
  format: CompatStreamFormat,
  run: (send: (event: StreamEvent) => Promise<void> | undefined) => Promise<unknown>,
): Promise<void> {
  reply.hijack()
  const res = reply.raw
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache, no-transform',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  })
  res.flushHeaders()
  res.socket?.setNoDelay(true)
  let closed = false
  res.on('close', () => {
    closed = true
  })
  const mapper = new RunEventMapper()
  let behind: Promise<void> | undefined
  // As SseWriter: a write the socket cannot take now is a wait for its drain (back-pressure down
  // to the agent); a client that drains nothing for the stall bound is cut.
  const send = (event: StreamEvent): Promise<void> | undefined => {
    if (closed) return undefined
    if (!res.write(encodeCompatSse(mapper.map(event), format)) && !behind)
      behind = whenDrained(res, DEFAULT_SSE_STALL_MS).finally(() => {
        behind = undefined
      })
    return behind
  }
  const heartbeat = setInterval(() => send({ type: 'heartbeat', at: new Date().toISOString() }), HEARTBEAT_MS)
  heartbeat.unref()
  try {
    await run(send)
  } finally {
    clearInterval(heartbeat)
    if (!closed) res.end()
    closed = true
  }
}
