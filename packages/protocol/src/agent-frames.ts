import { type Static, Type } from '@sinclair/typebox'
import { ApprovalAnswerSchema, MAX_APPROVAL_SUMMARY_CHARS } from './approvals.js'

/**
 * Frames of the `jsonl` agent protocol: one JSON object per line on the agent's stdin (in) and
 * stdout (out). Validated on receipt; an invalid frame fails the turn with `agent_protocol_error`.
 */
export const InboundFrameSchema = Type.Object({
  type: Type.Literal('message'),
  content: Type.String(),
  turn: Type.Integer(),
  turnId: Type.String(),
  /** The answer to the agent's approval request this turn carries (human review), if any. */
  approval: Type.Optional(ApprovalAnswerSchema),
})
export type InboundFrame = Static<typeof InboundFrameSchema>

export const OutboundFrameSchema = Type.Union([
  Type.Object({ type: Type.Literal('ready') }),
  Type.Object({ type: Type.Literal('text'), content: Type.String() }),
  Type.Object({ type: Type.Literal('status'), message: Type.String() }),
  Type.Object({
    type: Type.Literal('tool.start'),
    id: Type.String(),
    name: Type.String(),
    input: Type.Optional(Type.Unknown()),
  }),
  Type.Object({
    type: Type.Literal('tool.end'),
    id: Type.String(),
    output: Type.Optional(Type.Unknown()),
    isError: Type.Optional(Type.Boolean()),
  }),
  Type.Object({ type: Type.Literal('metadata'), data: Type.Record(Type.String(), Type.Unknown()) }),
  /** Asks a person to approve an action (human review); the answer comes as a later turn's input. */
  Type.Object({
    type: Type.Literal('approval.request'),
    summary: Type.String({ minLength: 1, maxLength: MAX_APPROVAL_SUMMARY_CHARS }),
    action: Type.Optional(Type.Unknown()),
  }),
  Type.Object({ type: Type.Literal('turn.done') }),
  Type.Object({ type: Type.Literal('error'), message: Type.String() }),
])
export type OutboundFrame = Static<typeof OutboundFrameSchema>

/** Environment variables every agent process receives. */
export const AGENT_ENV = {
  sessionId: 'CAIRN_SESSION_ID',
  turn: 'CAIRN_TURN',
  transcriptPath: 'CAIRN_TRANSCRIPT',
  stdioMark: 'CAIRN_STDIO_MARK',
  protocol: 'CAIRN_PROTOCOL',
} as const

/** One line of the transcript file handed to agents (`$CAIRN_TRANSCRIPT`, JSON Lines). */
export interface TranscriptLine {
  v: 1
  role: 'user' | 'assistant'
  turn: number
  content: string
}
