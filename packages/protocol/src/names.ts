/**
 * The protocol's names as plain constants, without TypeBox: what clients need at run time (the
 * SDK, the CLI) loads from here (`@cairn/protocol/core`) and so starts without building any schema.
 */

/** Server-sent events of a run (`POST /v1/sessions/{id}/messages`). */
export const SSE_EVENT_NAMES = [
  'run.started',
  'message.delta',
  'tool.start',
  'tool.end',
  'status',
  'run.completed',
  'run.failed',
  'run.cancelled',
  'heartbeat',
] as const
export type SseEventName = (typeof SSE_EVENT_NAMES)[number]

export const SESSION_STATUSES = ['active', 'idle', 'completed', 'failed', 'timeout', 'deleted'] as const
export type SessionStatus = (typeof SESSION_STATUSES)[number]
