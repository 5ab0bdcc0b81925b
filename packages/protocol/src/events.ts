import { type Static, Type } from '@sinclair/typebox'
import { ErrorBodySchema, MAX_EXACT_INTEGER } from './common.js'
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
export const ApprovalRequestedEventSchema = Type.Object(
  {
    ...turnEvent('approval.requested'),
    approvalId: Type.String(),
    summary: Type.String(),
    action: Type.Optional(Type.Unknown()),
  },
  {
    title: 'approval.requested',
    description:
      'The agent asked for approval (GET /v1/sessions/{id}/approvals/{approvalId} once the turn ended)',
  },
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
    ApprovalRequestedEventSchema,
    RunCompletedEventSchema,
    RunFailedEventSchema,
    RunCancelledEventSchema,
    HeartbeatEventSchema,
  ],
  {
    description:
      'Server-sent events: each message is `event: <type>`, `id: <n>` then `data: <one JSON object of this schema>`; ' +
      'the id counts the events of the turn from 1 (heartbeats have none), so a client whose connection dropped ' +
      'gets exactly what it missed from GET /v1/sessions/{id}/turns/{turnId}/events with Last-Event-ID; ' +
      'the stream ends after run.completed, run.failed or run.cancelled; heartbeats keep idle connections open.',
  },
)

export type RunStartedEvent = Static<typeof RunStartedEventSchema>
export type MessageDeltaEvent = Static<typeof MessageDeltaEventSchema>
export type ToolStartEvent = Static<typeof ToolStartEventSchema>
export type ToolEndEvent = Static<typeof ToolEndEventSchema>
export type StatusStreamEvent = Static<typeof StatusStreamEventSchema>
export type ApprovalRequestedEvent = Static<typeof ApprovalRequestedEventSchema>
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
  | ApprovalRequestedEvent
  | RunCompletedEvent
  | RunFailedEvent
  | RunCancelledEvent
  | HeartbeatEvent

/**
 * Where a turn's event stream is picked up again (`GET /v1/sessions/{id}/turns/{turnId}/events`):
 * after the event with this id (`after`, or the `Last-Event-ID` header, which wins when both are
 * sent: an EventSource reconnecting to a URL with `after` sends it).
 */
export const TurnEventsQuery = Type.Object(
  {
    after: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_EXACT_INTEGER,
        description: 'Send only the events whose id is greater (default 0: all)',
      }),
    ),
  },
  { additionalProperties: false },
)
export const TurnParams = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 200 }),
  turnId: Type.String({ minLength: 1, maxLength: 200 }),
})

/** Events of a build log followed live (`GET …/revisions/{rev}/logs?follow=true`). */
export const BuildLogEventSchema = Type.Union(
  [
    Type.Object({ line: Type.String() }, { title: 'log' }),
    Type.Object({ status: Type.String(), error: Type.Union([Type.String(), Type.Null()]) }, { title: 'end' }),
  ],
  {
    description:
      'Server-sent events: `event: log` with one line of the build log (`id:` its line number from 1), then one ' +
      '`event: end` with the outcome (`id:` the line count + 1); a reconnect with Last-Event-ID gets the lines ' +
      'after it, and one at or after the end an empty 204 (an EventSource stops there).',
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

/** Encodes one event in SSE wire format, with its id when it has one (heartbeats have none). */
export function encodeSse(event: StreamEvent, id?: number): string {
  const idLine = id === undefined ? '' : `id: ${id}\n`
  return `event: ${event.type}\n${idLine}data: ${JSON.stringify(event)}\n\n`
}
