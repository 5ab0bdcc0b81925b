import {
  CairnProblem,
  IdParams,
  type JsonRpcRequest,
  JsonRpcRequestSchema,
  JsonRpcStreamAnswerSchema,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { AgentService } from '../agents/agent-service.js'
import { principalOf } from '../auth/plugin.js'
import { errorResponses, eventStreamMedia, jsonResponse } from '../http/responses.js'
import { SseWriter, type SseWriterOptions } from '../http/sse.js'
import { agentCard, legacyAgentCard } from './a2a-card.js'
import type { A2AScope, A2AServices } from './a2a-handler.js'
import type { answerRpc } from './a2a-rpc.js'

export interface A2ADeps extends A2AServices {
  agents: AgentService
  version: string
  sse: SseWriterOptions
}

const HEADER = 'a2a-version'

/**
 * The A2A library and the params checks (a2a-rpc.ts), loaded by the first A2A request: ~0.1 s of
 * CPU and ~100 modules that a server start, and every test server, need not pay.
 */
let rpcModule: Promise<typeof import('./a2a-rpc.js')> | undefined
const loadRpc = () => {
  rpcModule ??= import('./a2a-rpc.js')
  return rpcModule
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
      const { dialectOf, V03, cardBody } = await loadRpc()
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
      const { dialectOf, V1, paramsRefusal, answerRpc } = await loadRpc()
      const dialect = dialectOf(request.headers[HEADER])
      if (dialect instanceof Error) return rpcError(body, V1.encodeError(dialect))
      if (!dialect.reads.has(body.method) && principal.role === 'read')
        throw new CairnProblem('forbidden', 'this API key is read-only')
      const scope = await scopeOf(request, request.params.id)
      const refused = paramsRefusal(dialect, body)
      if (refused) return rpcError(body, dialect.encodeError(refused))
      const answer = await answerRpc(deps, scope, dialect, body)
      if (!isStream(answer)) return answer
      await streamAnswers(reply, body, answer, { ...deps.sse, encodeError: dialect.encodeError })
    },
  )
}

function rpcError(body: JsonRpcRequest, error: unknown) {
  return { jsonrpc: '2.0', id: body.id ?? null, error }
}

type RpcAnswer = Awaited<ReturnType<typeof answerRpc>>
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
