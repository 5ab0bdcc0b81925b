import { type Static, Type } from '@sinclair/typebox'
import type { ErrorBody } from './errors.js'

export interface RunStartedEvent {
  type: 'run.started'
  sessionId: string
  turnId: string
  turn: number
  sandboxId: string
  coldStart: boolean
}
export interface MessageDeltaEvent {
  type: 'message.delta'
  turnId: string
  content: string
}
export interface ToolStartEvent {
  type: 'tool.start'
  turnId: string
  toolCallId: string
  name: string
  input?: unknown
}
export interface ToolEndEvent {
  type: 'tool.end'
  turnId: string
  toolCallId: string
  output?: unknown
  isError?: boolean
  durationMs?: number
}
export interface StatusStreamEvent {
  type: 'status'
  turnId: string
  message: string
}
export interface RunCompletedEvent {
  type: 'run.completed'
  turnId: string
  text: string
  durationMs: number
}
export interface RunFailedEvent extends ErrorBody {
  type: 'run.failed'
  turnId: string
  durationMs: number
}
export interface RunCancelledEvent {
  type: 'run.cancelled'
  turnId: string
  durationMs: number
}
export interface HeartbeatEvent {
  type: 'heartbeat'
  at: string
}

export type StreamEvent =
  | RunStartedEvent
  | MessageDeltaEvent
  | ToolStartEvent
  | ToolEndEvent
  | StatusStreamEvent
  | RunCompletedEvent
  | RunFailedEvent
  | RunCancelledEvent
  | HeartbeatEvent

/** What stays in the transcript for a tool call. */
export const ToolCallSchema = Type.Object({
  id: Type.String(),
  name: Type.String(),
  input: Type.Optional(Type.Unknown()),
  output: Type.Optional(Type.Unknown()),
  isError: Type.Optional(Type.Boolean()),
  durationMs: Type.Optional(Type.Number()),
})
export type ToolCall = Static<typeof ToolCallSchema>

export function isTerminalEvent(event: StreamEvent): boolean {
  return event.type === 'run.completed' || event.type === 'run.failed' || event.type === 'run.cancelled'
}

/** Encodes one event in SSE wire format. */
export function encodeSse(event: StreamEvent): string {
  return `event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`
}
