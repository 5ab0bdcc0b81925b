import {
  AgUiEventSchema,
  type AgUiRunInput,
  AgUiRunInputSchema,
  CairnProblem,
  IdParams,
  MAX_PROMPT_BYTES,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { FastifyInstance } from 'fastify'
import type { AgentService } from '../agents/agent-service.js'
import { requireWrite } from '../auth/plugin.js'
import { errorResponses, eventStreamMedia, TURN_ID_HEADER } from '../http/responses.js'
import { SseWriter, type SseWriterOptions } from '../http/sse.js'
import type { SessionService } from '../sessions/session-service.js'
import { AgUiEventMapper } from './ag-ui-events.js'
import type { AgUiThreads } from './ag-ui-threads.js'

export interface AgUiDeps {
  agents: AgentService
  sessions: SessionService
  threads: AgUiThreads
  sse: SseWriterOptions
}

/**
 * Each agent as an AG-UI agent: `POST /v1/agents/{id}/ag-ui` takes a RunAgentInput and answers
 * the run as AG-UI events over SSE. The thread is a session (see AgUiThreads); the run is one
 * turn of it, begun and streamed by the same services as `POST /v1/sessions/{id}/messages`.
 */
export function agUiRoutes(server: FastifyInstance, deps: AgUiDeps): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.post(
    '/v1/agents/:id/ag-ui',
    {
      schema: {
        tags: ['ag-ui'],
        summary:
          "An AG-UI run (RunAgentInput): the last message, the user's, is a turn of the thread's session; the answer is AG-UI events over SSE",
        params: IdParams,
        body: AgUiRunInputSchema,
        response: {
          200: {
            description:
              'AG-UI events, each the JSON data of one SSE event (the Cairn-Session-Id header names the session)',
            content: { 'text/event-stream': eventStreamMedia(AgUiEventSchema) },
            headers: {
              ...TURN_ID_HEADER,
              'Cairn-Session-Id': { type: 'string', description: "The thread's session" },
            },
          },
          ...errorResponses(400, 401, 403, 404, 409, 410),
        },
      },
    },
    async (request, reply) => {
      const { tenantId } = requireWrite(request)
      const input = request.body
      const prompt = promptOf(input)
      const agent = await deps.agents.require(tenantId, request.params.id)
      const sessionId = await deps.threads.sessionFor(tenantId, agent, input.threadId)
      const handle = await deps.sessions.startTurn(tenantId, sessionId, prompt)
      reply.raw.setHeader('cairn-session-id', sessionId)
      reply.raw.setHeader('cairn-turn-id', handle.turnId)
      reply.hijack()
      const writer = new SseWriter(reply.raw, { ...deps.sse, heartbeat: 'comment' })
      const mapper = new AgUiEventMapper({ ...input, sessionId, turnId: handle.turnId })
      let ended = false
      try {
        await writer.sendData(mapper.runStarted())
        await handle.run((event) => {
          let behind: Promise<void> | undefined
          for (const out of mapper.map(event)) behind = writer.sendData(out) ?? behind
          if (event.type === 'run.completed' || event.type === 'run.failed' || event.type === 'run.cancelled')
            ended = true
          return behind
        })
      } catch (error) {
        if (!ended) for (const out of mapper.failed(error)) writer.sendData(out)
      } finally {
        writer.end()
      }
    },
  )
}

/** The run's prompt: the text of the last message, which must be the user's. */
function promptOf(input: AgUiRunInput): string {
  const last = input.messages.at(-1)
  const where = `messages[${input.messages.length - 1}]`
  if (last?.role !== 'user')
    throw new CairnProblem(
      'validation_failed',
      `${where} is a ${last?.role} message: the last message of a run must be the user's (Cairn's agents run their own tools)`,
    )
  const content = last.content ?? ''
  const text =
    typeof content === 'string'
      ? content
      : content
          .map((part, index) => {
            if (part.type !== 'text' || part.text === undefined)
              throw new CairnProblem(
                'validation_failed',
                `${where}.content[${index}] is a ${part.type} part: a Cairn agent takes text only`,
              )
            return part.text
          })
          .join('\n')
  if (text.trim() === '') throw new CairnProblem('validation_failed', `${where} has no text`)
  if (Buffer.byteLength(text) > MAX_PROMPT_BYTES)
    throw new CairnProblem('validation_failed', `${where} is over ${MAX_PROMPT_BYTES} bytes`)
  return text
}
