import { type Static, Type } from '@sinclair/typebox'
import { ErrorBodySchema } from './common.js'
import type { ErrorBody } from './errors.js'

/** Fields every event of a turn carries. */
const turnEvent = <T extends string>(type: T) => ({ type: Type.Literal(type), turnId: Type.String() })

export const RunStartedEventSchema = Type.Object(
  {
    ...turnEvent('run.started'),
    sessionId: Type.String(),
    turn: Type.Integer(),
    sandboxId: Type.String(),
    coldStart: Type.Boolean(),
  },
  { title: 'run.started' },
)
export const MessageDeltaEventSchema = Type.Object(
  { ...turnEvent('message.delta'), content: Type.String() },
  { title: 'message.delta' },
)
export const ToolStartEventSchema = Type.Object(
  {
    ...turnEvent('tool.start'),
    toolCallId: Type.String(),
    name: Type.String(),
    input: Type.Optional(Type.Unknown()),
  },
  { title: 'tool.start' },
)
export const ToolEndEventSchema = Type.Object(
  {
    ...turnEvent('tool.end'),
    toolCallId: Type.String(),
    output: Type.Optional(Type.Unknown()),
    isError: Type.Optional(Type.Boolean()),
    durationMs: Type.Optional(Type.Number()),
  },
  { title: 'tool.end' },
)
export const StatusStreamEventSchema = Type.Object(
  { ...turnEvent('status'), message: Type.String() },
  { title: 'status' },
)
export const RunCompletedEventSchema = Type.Object(
  { ...turnEvent('run.completed'), text: Type.String(), durationMs: Type.Number() },
  { title: 'run.completed' },
)
export const RunFailedEventSchema = Type.Object(
  { ...turnEvent('run.failed'), durationMs: Type.Number(), error: ErrorBodySchema.properties.error },
  { title: 'run.failed', description: 'The error is in the registry shape of every error body.' },
)
export const RunCancelledEventSchema = Type.Object(
  { ...turnEvent('run.cancelled'), durationMs: Type.Number() },
  { title: 'run.cancelled' },
)
export const HeartbeatEventSchema = Type.Object(
  { type: Type.Literal('heartbeat'), at: Type.String() },
  { title: 'heartbeat' },
)

/**
 * One event of the SSE stream a run answers with: each is sent as `event: <type>` and
 * `data: <this JSON>`. Clients skip event types they do not know (a newer server may add some).
 */
export const StreamEventSchema = Type.Union(
  [
    RunStartedEventSchema,
    MessageDeltaEventSchema,
    ToolStartEventSchema,
    ToolEndEventSchema,
    StatusStreamEventSchema,
    RunCompletedEventSchema,
    RunFailedEventSchema,
    RunCancelledEventSchema,
    HeartbeatEventSchema,
  ],
  {
    description:
      'Server-sent events: each message is `event: <type>` then `data: <one JSON object of this schema>`; ' +
      'the stream ends after run.completed, run.failed or run.cancelled; heartbeats keep idle connections open.',
  },
)

export type RunStartedEvent = Static<typeof RunStartedEventSchema>
export type MessageDeltaEvent = Static<typeof MessageDeltaEventSchema>
export type ToolStartEvent = Static<typeof ToolStartEventSchema>
export type ToolEndEvent = Static<typeof ToolEndEventSchema>
export type StatusStreamEvent = Static<typeof StatusStreamEventSchema>
export type RunCompletedEvent = Static<typeof RunCompletedEventSchema>
/** Its error code is one of the registry's. */
export type RunFailedEvent = Omit<Static<typeof RunFailedEventSchema>, 'error'> & ErrorBody
export type RunCancelledEvent = Static<typeof RunCancelledEventSchema>
export type HeartbeatEvent = Static<typeof HeartbeatEventSchema>

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

/** Events of a build log followed live (`GET …/revisions/{rev}/logs?follow=true`). */
export const BuildLogEventSchema = Type.Union(
  [
    Type.Object({ line: Type.String() }, { title: 'log' }),
    Type.Object({ status: Type.String(), error: Type.Union([Type.String(), Type.Null()]) }, { title: 'end' }),
  ],
  {
    description:
      'Server-sent events: `event: log` with one line of the build log, then one `event: end` with the outcome.',
  },
)

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
