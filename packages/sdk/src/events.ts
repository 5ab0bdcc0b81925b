import type { StreamEvent } from '@cairn/protocol'
import { type ErrorCode, isErrorCode, SSE_EVENT_NAMES, type SseEventName } from '@cairn/protocol/core'
import type { SseMessage } from './sse.js'

type Json = Record<string, unknown>

const isRecord = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v)
const str = (v: unknown, fallback = ''): string => (typeof v === 'string' ? v : fallback)
const num = (v: unknown, fallback = 0): number => (typeof v === 'number' && Number.isFinite(v) ? v : fallback)

function isEventName(name: string): name is SseEventName {
  return (SSE_EVENT_NAMES as readonly string[]).includes(name)
}

/**
 * Turns one SSE message into a typed event. Wire data is checked field by field, never cast;
 * event types this SDK does not know (a newer server) give `undefined` and are skipped.
 */
export function decodeEvent(message: SseMessage): StreamEvent | undefined {
  let data: unknown
  try {
    data = JSON.parse(message.data)
  } catch {
    return undefined
  }
  if (!isRecord(data)) return undefined
  const type = typeof data.type === 'string' ? data.type : message.event
  if (!isEventName(type)) return undefined
  const turnId = str(data.turnId)
  switch (type) {
    case 'run.started':
      return {
        type,
        sessionId: str(data.sessionId),
        turnId,
        turn: num(data.turn),
        sandboxId: str(data.sandboxId),
        coldStart: data.coldStart === true,
      }
    case 'message.delta':
      return { type, turnId, content: str(data.content) }
    case 'tool.start': {
      const event: StreamEvent = { type, turnId, toolCallId: str(data.toolCallId), name: str(data.name) }
      if ('input' in data) event.input = data.input
      return event
    }
    case 'tool.end': {
      const event: StreamEvent = { type, turnId, toolCallId: str(data.toolCallId) }
      if ('output' in data) event.output = data.output
      if (typeof data.isError === 'boolean') event.isError = data.isError
      if (typeof data.durationMs === 'number') event.durationMs = data.durationMs
      return event
    }
    case 'status':
      return { type, turnId, message: str(data.message) }
    case 'run.completed':
      return { type, turnId, text: str(data.text), durationMs: num(data.durationMs) }
    case 'run.failed': {
      const error = isRecord(data.error) ? data.error : {}
      const code: ErrorCode = isErrorCode(error.code) ? error.code : 'internal'
      const event: StreamEvent = {
        type,
        turnId,
        durationMs: num(data.durationMs),
        error: { code, message: str(error.message, 'the run failed') },
      }
      if (typeof error.requestId === 'string') event.error.requestId = error.requestId
      if (isRecord(error.details)) event.error.details = error.details
      return event
    }
    case 'run.cancelled':
      return { type, turnId, durationMs: num(data.durationMs) }
    case 'heartbeat':
      return { type, at: str(data.at) }
  }
}
