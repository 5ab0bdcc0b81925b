import type { AgentEvent, TurnOutcome } from './types.js'

export type Failure = Omit<Extract<TurnOutcome, { status: 'failed' }>, 'status' | 'text' | 'stderr'>

/** The turn an agent process is running: where its output goes and how it ends. */
export interface ActiveTurn {
  text: string
  /** stdio: output seen before the agent asked for this turn's line (a banner, unless it exits). */
  early: string
  onEvent: (event: AgentEvent) => void
  finish: (outcome: TurnOutcome) => void
  fail: (failure: Failure) => void
}

/**
 * What a protocol reports into: the running turn (if any), its reply text (capped) and the
 * agent's stderr so far.
 */
export interface TurnChannel {
  readonly active: ActiveTurn | undefined
  /** Adds reply text; an agent that floods its output past the cap is stopped (`output_limit`). */
  appendText(turn: ActiveTurn, text: string): void
  /** The most reply characters one turn (or one jsonl frame) may hold. */
  readonly maxOutputChars: number
  stderr(): string
}
