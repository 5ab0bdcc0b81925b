import { type AgentCard, AgentCard as AgentCardJson } from '@a2a-js/sdk'
import { RequestMalformedError, VersionNotSupportedError } from '@a2a-js/sdk/errors'
import { JsonRpcTransportHandler, ServerCallContext } from '@a2a-js/sdk/server'
import {
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
import { A2A_VERSION, agentCard } from './a2a-card.js'
import { type A2AScope, type A2AServices, CairnA2AHandler } from './a2a-handler.js'

export interface A2ADeps extends A2AServices {
  agents: AgentService
  version: string
  sse: SseWriterOptions
}

const HEADER = 'a2a-version'
/** Methods a read-only key may call. */
const READ_METHODS = new Set(['GetTask', 'SubscribeToTask', 'GetExtendedAgentCard', 'ListTasks'])
/** The params each served method is checked against before the A2A library decodes them. */
const PARAMS: Record<string, ReturnType<typeof TypeCompiler.Compile<TSchema>>> = {
  SendMessage: TypeCompiler.Compile(A2ASendMessageParams),
  SendStreamingMessage: TypeCompiler.Compile(A2ASendMessageParams),
  GetTask: TypeCompiler.Compile(A2ATaskParams),
  CancelTask: TypeCompiler.Compile(A2ATaskParams),
  SubscribeToTask: TypeCompiler.Compile(A2ATaskParams),
}
const errors = errorResponses(400, 401, 403, 404)
const tags = ['a2a']

/**
 * Each agent as an A2A server (v1.0, JSON-RPC binding): its card under the endpoint's
 * `.well-known/agent-card.json`, and the endpoint. The JSON-RPC is decoded and encoded by the
 * official A2A library (`JsonRpcTransportHandler`); what it asks for is done by `CairnA2AHandler`
 * on the session and turn services. Under /v1, so keys, rate limits and the tenant sweep apply.
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
    async (request) => cardBody((await scopeOf(request, request.params.id)).card),
  )

  app.post(
    '/v1/agents/:id/a2a',
    {
      schema: {
        tags,
        summary:
          'A2A JSON-RPC (v1.0): SendMessage, SendStreamingMessage (SSE), GetTask, CancelTask, SubscribeToTask; a context is a session, a task a turn',
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
      if (!READ_METHODS.has(body.method) && principal.role === 'read')
        throw new CairnProblem('forbidden', 'this API key is read-only')
      const scope = await scopeOf(request, request.params.id)
      const refused = refusal(body, request.headers[HEADER])
      if (refused) return rpcError(body, refused)
      const transport = new JsonRpcTransportHandler(new CairnA2AHandler(deps, scope))
      const answer = await transport.handle(body, new ServerCallContext({ requestedVersion: A2A_VERSION }))
      if (!isStream(answer)) return answer
      await streamAnswers(reply, body, answer, deps.sse)
    },
  )
}

/** The card as JSON (the A2A library's encoding: its field names and enum spellings). */
function cardBody(card: AgentCard): Record<string, unknown> {
  return AgentCardJson.toJSON(card) as Record<string, unknown>
}

/** A version or params the request cannot be served with (answered as a JSON-RPC error). */
function refusal(body: JsonRpcRequest, header: string | string[] | undefined): Error | undefined {
  // A request without the header is A2A 0.3's (the spec's default); Cairn serves 1.0.
  const version = (Array.isArray(header) ? header.at(-1) : header) ?? '0.3'
  if (version !== A2A_VERSION && version !== '1')
    return new VersionNotSupportedError({
      message: `A2A version ${version} is not served: send A2A-Version: ${A2A_VERSION}`,
      metadata: { code: 'bad_request' },
    })
  const check = PARAMS[body.method]
  if (!check || check.Check(body.params)) return undefined
  const first = check.Errors(body.params).First()
  return new RequestMalformedError({
    message: `params${first?.path ?? ''}: ${first?.message ?? 'invalid'}`,
    metadata: { code: 'validation_failed' },
  })
}

function rpcError(body: JsonRpcRequest, error: Error) {
  return { jsonrpc: '2.0', id: body.id ?? null, error: JsonRpcTransportHandler.mapToJSONRPCError(error) }
}

type RpcAnswer = Awaited<ReturnType<JsonRpcTransportHandler['handle']>>
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
  sse: SseWriterOptions,
): Promise<void> {
  let first: IteratorResult<unknown>
  try {
    first = await answers.next()
  } catch (error) {
    return void reply.send(rpcError(body, error as Error))
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
    await writer.sendData(rpcError(body, error as Error))
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
