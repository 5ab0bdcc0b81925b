import { type AgentCard, AgentCard as AgentCardJson } from '@a2a-js/sdk'
import { LegacyJsonRpcTransportHandler } from '@a2a-js/sdk/compat/v0_3/server'
import { RequestMalformedError, VersionNotSupportedError } from '@a2a-js/sdk/errors'
import { type A2ARequestHandler, JsonRpcTransportHandler, ServerCallContext } from '@a2a-js/sdk/server'
import {
  A2ALegacySendParams,
  A2ALegacyTaskParams,
  A2ASendMessageParams,
  A2ATaskParams,
  CairnProblem,
  IdParams,
  type JsonRpcRequest,
  JsonRpcRequestSchema,
  JsonRpcStreamAnswerSchema,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { type TSchema, Type } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { AgentService } from '../agents/agent-service.js'
import { principalOf } from '../auth/plugin.js'
import { errorResponses, eventStreamMedia, jsonResponse } from '../http/responses.js'
import { SseWriter, type SseWriterOptions } from '../http/sse.js'
import { A2A_LEGACY_VERSION, A2A_VERSION, agentCard, legacyAgentCard } from './a2a-card.js'
import { type A2AScope, type A2AServices, CairnA2AHandler } from './a2a-handler.js'

export interface A2ADeps extends A2AServices {
  agents: AgentService
  version: string
  sse: SseWriterOptions
}

const HEADER = 'a2a-version'
type ParamsCheck = ReturnType<typeof TypeCompiler.Compile<TSchema>>
type RpcTransport = Pick<JsonRpcTransportHandler, 'handle'>

/**
 * A version of A2A's JSON-RPC as served: the params each method is checked against before the
 * A2A library decodes them, the methods a read-only key may call, and the library's transport
 * handler and error encoding for that version (both answer with the same `CairnA2AHandler`).
 */
interface Dialect {
  version: string
  params: Record<string, ParamsCheck>
  reads: Set<string>
  transport(handler: A2ARequestHandler): RpcTransport
  encodeError(error: unknown): unknown
}

const V1: Dialect = {
  version: A2A_VERSION,
  params: {
    SendMessage: TypeCompiler.Compile(A2ASendMessageParams),
    SendStreamingMessage: TypeCompiler.Compile(A2ASendMessageParams),
    GetTask: TypeCompiler.Compile(A2ATaskParams),
    CancelTask: TypeCompiler.Compile(A2ATaskParams),
    SubscribeToTask: TypeCompiler.Compile(A2ATaskParams),
  },
  reads: new Set(['GetTask', 'SubscribeToTask', 'GetExtendedAgentCard', 'ListTasks']),
  transport: (handler) => new JsonRpcTransportHandler(handler),
  encodeError: (error) => JsonRpcTransportHandler.mapToJSONRPCError(error),
}

const V03: Dialect = {
  version: A2A_LEGACY_VERSION,
  params: {
    'message/send': TypeCompiler.Compile(A2ALegacySendParams),
    'message/stream': TypeCompiler.Compile(A2ALegacySendParams),
    'tasks/get': TypeCompiler.Compile(A2ALegacyTaskParams),
    'tasks/cancel': TypeCompiler.Compile(A2ALegacyTaskParams),
    'tasks/resubscribe': TypeCompiler.Compile(A2ALegacyTaskParams),
  },
  reads: new Set(['tasks/get', 'tasks/resubscribe', 'agent/getAuthenticatedExtendedCard']),
  transport: (handler) => new LegacyJsonRpcTransportHandler(handler),
  encodeError: (error) => LegacyJsonRpcTransportHandler.mapToLegacyJSONRPCError(error),
}

/** The dialect a request asks for: no `A2A-Version` is 0.3 (the spec's rule), `1.0` is 1.0. */
function dialectOf(header: string | string[] | undefined): Dialect | Error {
  const version = Array.isArray(header) ? header.at(-1) : header
  if (version === undefined || version === '0.3' || version === '0.3.0') return V03
  if (version === '1.0' || version === '1') return V1
  return new VersionNotSupportedError({
    message: `A2A version ${version} is not served: send A2A-Version: ${A2A_VERSION} (or none, for 0.3)`,
    metadata: { code: 'bad_request' },
  })
}

const errors = errorResponses(400, 401, 403, 404)
const tags = ['a2a']

/**
 * Each agent as an A2A server (JSON-RPC binding, 1.0 and 0.3): its card under the endpoint's
 * `.well-known/agent-card.json`, and the endpoint. The JSON-RPC is decoded and encoded by the
 * official A2A library (`JsonRpcTransportHandler`, and its `LegacyJsonRpcTransportHandler` for
 * 0.3); what it asks for is done by `CairnA2AHandler` on the session and turn services. Under
 * /v1, so keys, rate limits and the tenant sweep apply.
 */
export function a2aRoutes(server: FastifyInstance, deps: A2ADeps): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  const scopeOf = async (request: FastifyRequest, agentId: string): Promise<A2AScope> => {
    const { tenantId } = principalOf(request)
    const agent = await deps.agents.require(tenantId, agentId)
    const baseUrl = baseUrlOf(request)
    const card = agentCard(
      { name: agent.name, currentRevisionId: agent.current_revision_id },
      baseUrl,
      deps.version,
    )
    return { tenantId, agent: { id: agent.id, name: agent.name }, card, baseUrl }
  }

  app.get(
    '/v1/agents/:id/a2a/.well-known/agent-card.json',
    {
      schema: {
        tags,
        summary: "The agent's A2A card (its endpoint, skills and security scheme)",
        params: IdParams,
        response: {
          200: jsonResponse(Type.Record(Type.String(), Type.Unknown()), 'An A2A agent card'),
          ...errors,
        },
      },
    },
    async (request) => {
      const { card, agent, baseUrl } = await scopeOf(request, request.params.id)
      if (dialectOf(request.headers[HEADER]) !== V03) return cardBody(card)
      const legacy = { name: agent.name, currentRevisionId: card.version }
      return legacyAgentCard(legacy, baseUrl, deps.version)
    },
  )

  app.post(
    '/v1/agents/:id/a2a',
    {
      schema: {
        tags,
        summary:
          'A2A JSON-RPC, 1.0 (A2A-Version: 1.0: SendMessage, SendStreamingMessage, GetTask, CancelTask, SubscribeToTask) and 0.3 (no A2A-Version: message/send, message/stream, tasks/get, tasks/cancel, tasks/resubscribe); a context is a session, a task a turn',
        params: IdParams,
        body: JsonRpcRequestSchema,
        response: {
          200: {
            description: 'A JSON-RPC response, or for the streaming methods an SSE stream of them',
            content: {
              'application/json': { schema: Type.Record(Type.String(), Type.Unknown()) },
              'text/event-stream': eventStreamMedia(JsonRpcStreamAnswerSchema),
            },
          },
          ...errors,
        },
      },
    },
    async (request, reply) => {
      const principal = principalOf(request)
      const body = request.body
      const dialect = dialectOf(request.headers[HEADER])
      if (dialect instanceof Error) return rpcError(body, V1.encodeError(dialect))
      if (!dialect.reads.has(body.method) && principal.role === 'read')
        throw new CairnProblem('forbidden', 'this API key is read-only')
      const scope = await scopeOf(request, request.params.id)
      const refused = paramsRefusal(dialect, body)
      if (refused) return rpcError(body, dialect.encodeError(refused))
      const transport = dialect.transport(new CairnA2AHandler(deps, scope))
      const answer = await transport.handle(
        body,
        new ServerCallContext({ requestedVersion: dialect.version }),
      )
      if (!isStream(answer)) return answer
      await streamAnswers(reply, body, answer, { ...deps.sse, encodeError: dialect.encodeError })
    },
  )
}

/** The card as JSON (the A2A library's encoding: its field names and enum spellings). */
function cardBody(card: AgentCard): Record<string, unknown> {
  return AgentCardJson.toJSON(card) as Record<string, unknown>
}

/** Params the method cannot be served with (answered as a JSON-RPC error naming the path). */
function paramsRefusal(dialect: Dialect, body: JsonRpcRequest): Error | undefined {
  // Own properties only: a method named `constructor` or `__proto__` is an unknown method.
  const check = Object.hasOwn(dialect.params, body.method) ? dialect.params[body.method] : undefined
  if (!check || check.Check(body.params)) return undefined
  const first = check.Errors(body.params).First()
  return new RequestMalformedError({
    message: `params${first?.path ?? ''}: ${first?.message ?? 'invalid'}`,
    metadata: { code: 'validation_failed' },
  })
}

function rpcError(body: JsonRpcRequest, error: unknown) {
  return { jsonrpc: '2.0', id: body.id ?? null, error }
}

type RpcAnswer = Awaited<ReturnType<RpcTransport['handle']>>
type RpcStream = Extract<RpcAnswer, AsyncGenerator>

function isStream(answer: RpcAnswer): answer is RpcStream {
  return typeof (answer as Partial<AsyncGenerator>)[Symbol.asyncIterator] === 'function'
}

/**
 * A streaming method's answers: a refusal before its first answer (the turn could not begin) is a
 * plain JSON-RPC error; after it, each answer is an SSE event, and a failure the last one.
 */
async function streamAnswers(
  reply: FastifyReply,
  body: JsonRpcRequest,
  answers: RpcStream,
  options: SseWriterOptions & { encodeError: (error: unknown) => unknown },
): Promise<void> {
  const { encodeError, ...sse } = options
  let first: IteratorResult<unknown>
  try {
    first = await answers.next()
  } catch (error) {
    return void reply.send(rpcError(body, encodeError(error)))
  }
  reply.hijack()
  const writer = new SseWriter(reply.raw, { ...sse, heartbeat: 'comment' })
  try {
    if (!first.done) await writer.sendData(first.value)
    for await (const answer of answers) {
      if (writer.closed) break
      await writer.sendData(answer)
    }
  } catch (error) {
    await writer.sendData(rpcError(body, encodeError(error)))
  } finally {
    writer.end()
  }
}

/** The API's base URL as the client reached it (links in the card and in artifacts). */
function baseUrlOf(request: FastifyRequest): string {
  const forwarded = request.headers['x-forwarded-proto']
  const scheme = forwarded === 'https' || forwarded === 'http' ? forwarded : request.protocol
  return `${scheme}://${request.host}`
}
