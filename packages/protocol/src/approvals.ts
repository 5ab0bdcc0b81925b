import { type Static, Type } from '@sinclair/typebox'
import { MAX_IDLE_TIMEOUT_MS } from './sessions.js'

/**
 * Human review (docs/approvals.md): an agent asks for approval of an action with a summary; a
 * person (any write key of the tenant) approves or denies it with an optional note; the answer
 * reaches the agent as the input of a turn. A pending request past its session's
 * `approvalTimeoutMs` is `expired`.
 */
export const APPROVAL_STATUSES = ['pending', 'approved', 'denied', 'expired'] as const
export type ApprovalStatus = (typeof APPROVAL_STATUSES)[number]

export const APPROVAL_DECISIONS = ['approve', 'deny'] as const
export type ApprovalDecision = (typeof APPROVAL_DECISIONS)[number]

/** Longest summary an agent may give (characters). */
export const MAX_APPROVAL_SUMMARY_CHARS = 4000
/** Longest note an answer may carry (characters). */
export const MAX_APPROVAL_NOTE_CHARS = 4000
/** Longest a pending request may wait by policy (`approvalTimeoutMs`). */
export const MAX_APPROVAL_TIMEOUT_MS = MAX_IDLE_TIMEOUT_MS

export const ApprovalStatusSchema = Type.Union(APPROVAL_STATUSES.map((s) => Type.Literal(s)))

export const ApprovalSchema = Type.Object({
  id: Type.String({ description: 'apr_…' }),
  sessionId: Type.String(),
  /** The turn in which the agent asked. */
  turnId: Type.String(),
  status: ApprovalStatusSchema,
  summary: Type.String(),
  /** What the agent said it wants to do (its `action`, any JSON), if it said. */
  action: Type.Optional(Type.Unknown()),
  note: Type.Union([Type.String(), Type.Null()]),
  /** The review snapshot: the workspace as it was when the agent asked. */
  snapshotId: Type.Union([Type.String(), Type.Null()]),
  requestedAt: Type.String(),
  /** When a pending request becomes `expired` (null: never). */
  expiresAt: Type.Union([Type.String(), Type.Null()]),
  answeredAt: Type.Union([Type.String(), Type.Null()]),
  /** The turn that carried the answer (or the expiry) to the agent; null: not yet. */
  deliveredTurnId: Type.Union([Type.String(), Type.Null()]),
})
export type Approval = Static<typeof ApprovalSchema>

export const ApprovalListSchema = Type.Object({ data: Type.Array(ApprovalSchema) })

export const ApprovalParams = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 200 }),
  approvalId: Type.String({ minLength: 1, maxLength: 200 }),
})

export const AnswerApprovalBody = Type.Object(
  {
    decision: Type.Union(
      APPROVAL_DECISIONS.map((d) => Type.Literal(d)),
      { description: 'approve or deny the action' },
    ),
    note: Type.Optional(
      Type.String({ maxLength: MAX_APPROVAL_NOTE_CHARS, description: 'told to the agent' }),
    ),
  },
  { additionalProperties: false },
)
export type AnswerApprovalBody = Static<typeof AnswerApprovalBody>

/** What the agent is told with a turn's input: the answer, or that nobody answered in time. */
export const ApprovalAnswerSchema = Type.Object(
  {
    id: Type.String(),
    decision: Type.Union([Type.Literal('approve'), Type.Literal('deny'), Type.Literal('expired')]),
    note: Type.Union([Type.String(), Type.Null()]),
  },
  { additionalProperties: false },
)
export type ApprovalAnswer = Static<typeof ApprovalAnswerSchema>

/** The prompt of the turn that carries an answer (what stdio and exec agents, and the transcript, read). */
export function approvalPrompt(answer: ApprovalAnswer): string {
  const said =
    answer.decision === 'approve' ? 'approved' : answer.decision === 'deny' ? 'denied' : 'expired unanswered'
  return `[approval ${answer.id} ${said}]${answer.note ? ` ${answer.note}` : ''}`
}
