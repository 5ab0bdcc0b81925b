import type { ApprovalAnswer } from '@cairn/protocol'
import type { AgentInfo, WorkspaceMark } from '@cairn/runtime/port'
import type { SessionRow } from './session-store.js'

/** An approval request the agent made during a turn (human review), redacted. */
export interface ApprovalAsked {
  id: string
  turnId: string
  seq: number
  summary: string
  action?: unknown
}

/**
 * What other services learn of a session's life, passed to the session service by the composition
 * root (server.ts). Each method is optional; every observer is told, in the order given.
 */
export interface SessionObserver {
  /** A session was created (not awaited: a snapshot of turn 0 is taken in the background). */
  created?(row: SessionRow): void
  /** The turn is about to be sent to its agent (pre-turn snapshots); awaited. */
  beforeTurn?(row: SessionRow, seq: number): Promise<void>
  /**
   * Whether the turn left the workspace exactly as the observer last saw it (see
   * `SnapshotPolicy.unchanged`). A turn counts as unchanged only when every observer that
   * answers says so; such a turn moves neither the generation nor, then, the subvolume.
   */
  unchanged?(sessionId: string, answered?: MarkAnswer): Promise<boolean>
  /**
   * The workspace as the observer last saw it, asked just before the turn is sent: the runtime
   * compares it after the turn in the same call (`TurnOptions.mark`), and `unchanged` is given
   * the answer instead of asking again. Undefined: nothing to compare against.
   */
  turnMark?(sessionId: string): WorkspaceMark | undefined
  /**
   * The turn has ended and its outcome was sent (not awaited: off the critical path); `agent` is
   * the warm agent still up, `unchanged` what the observers answered for the turn.
   */
  afterTurn?(row: SessionRow, seq: number, agent: AgentInfo | undefined, unchanged: boolean): void
  /**
   * The agent asked for approval during the turn, which completed: recorded (with its review
   * snapshot) before the turn's end is; awaited.
   */
  approvalRequested?(row: SessionRow, asked: ApprovalAsked): Promise<void>
  /**
   * The answer (or expiry) of the session's open approval request (`row.approval_id`) for the turn
   * `turnId`, just begun, to carry to the agent; claimed for that turn. Undefined: nothing to tell yet.
   */
  approvalFor?(row: SessionRow, turnId: string): Promise<ApprovalAnswer | undefined>
  /** A session's workspace was deleted (its snapshots go next); awaited. */
  deleted?(sessionId: string): Promise<void>
  /** A session was ended by its user or deleted; awaited (the answer says it is over). */
  ended?(sessionId: string): Promise<void>
}

/** What the runtime answered after the turn for the mark it was given (`turnMark`). */
export interface MarkAnswer {
  mark: WorkspaceMark
  unchanged: boolean
}

/** The mark sent with the turn (the first observer's that has one). */
export function turnMarkOf(
  observers: readonly SessionObserver[],
  sessionId: string,
): WorkspaceMark | undefined {
  for (const observer of observers) {
    const mark = observer.turnMark?.(sessionId)
    if (mark) return mark
  }
  return undefined
}

/** Whether every observer that answers says the turn left the workspace unchanged (none: no). */
export async function unchangedByAll(
  observers: readonly SessionObserver[],
  sessionId: string,
  answered?: MarkAnswer,
): Promise<boolean> {
  let asked = 0
  for (const observer of observers) {
    if (!observer.unchanged) continue
    asked++
    if (!(await observer.unchanged(sessionId, answered))) return false
  }
  return asked > 0
}
