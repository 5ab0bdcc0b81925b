import { CairnProblem, isErrorCode, type StreamEvent } from '@cairn/protocol'
import type { SessionService } from '../sessions/session-service.js'
import type { ToolAnswer, ToolCall } from './tool-call.js'

/** What a progress notification says of a turn's event (nothing for its start and end). */
function progressOf(event: StreamEvent): string | undefined {
  switch (event.type) {
    case 'message.delta':
      return event.content
    case 'status':
      return event.message
    case 'tool.start':
      return `tool ${event.name} started`
    case 'tool.end':
      return `tool call ${event.toolCallId} ${event.isError ? 'failed' : 'ended'}`
    default:
      return undefined
  }
}

/**
 * One turn, as `POST /v1/sessions/{id}/messages` runs it (the same checks, the same turn), told to
 * the client as progress notifications; the answer is the reply. A turn that fails is a tool error
 * with the turn's own error code. A client that goes away does not stop the turn (as with SSE): it
 * runs to its end, and its reply is in the transcript.
 */
export async function sendMessage(
  sessions: SessionService,
  call: ToolCall,
  sessionId: string,
  prompt: string,
): Promise<ToolAnswer> {
  const handle = await sessions.startTurn(call.tenantId, sessionId, prompt)
  let end: StreamEvent | undefined
  await handle.run((event) => {
    if (event.type === 'run.completed' || event.type === 'run.failed' || event.type === 'run.cancelled') {
      end = event
      return undefined
    }
    const message = progressOf(event)
    // Never a rejection: the turn would take a client's failure for its own.
    return message === undefined ? undefined : call.progress(message)?.catch(() => undefined)
  })
  const turn = { sessionId, turnId: handle.turnId }
  if (end?.type === 'run.completed')
    return {
      structured: { ...turn, status: 'completed', text: end.text, durationMs: end.durationMs },
      text: end.text,
    }
  if (end?.type === 'run.cancelled')
    return { structured: { ...turn, status: 'cancelled', text: '', durationMs: end.durationMs }, text: '' }
  const error = end?.type === 'run.failed' ? end.error : undefined
  throw new CairnProblem(
    isErrorCode(error?.code) ? error.code : 'internal',
    error?.message ?? 'the turn ended without an outcome',
    { ...error?.details, ...turn },
  )
}
