/** Typings for the Cairn agent kit (jsonl protocol), `/opt/cairn/node/index.mjs`. */

/** One line of `$CAIRN_TRANSCRIPT`: a message of an earlier turn of the session. */
export interface TranscriptLine {
  v: 1
  role: 'user' | 'assistant'
  turn: number
  content: string
}

export interface ToolEndOptions {
  /** The call failed: `output` describes the error. */
  isError?: boolean
}

/** One user message and the means to answer it. Frames sent after done() or error() throw. */
export declare class Turn {
  /** The user's message. */
  readonly content: string
  /** The turn's number in the session, from 1. */
  readonly turn: number
  readonly turnId: string
  /** done() or error() was sent. */
  readonly finished: boolean
  /** Earlier turns of the session (user and assistant messages), oldest first. */
  transcript(): TranscriptLine[]
  /** Streams text of the reply. */
  write(text: string): void
  /** A progress line shown to the user (not part of the reply). */
  status(message: string): void
  /** Reports the start of a tool call; returns its id for toolEnd(). */
  toolStart(name: string, input?: unknown): string
  /** Reports the end of a tool call started with toolStart(). */
  toolEnd(id: string, output?: unknown, options?: ToolEndOptions): void
  /**
   * Runs `fn` as a reported tool call: tool.start with `input`, tool.end with its result, or with
   * `isError` and the error's text if it throws (the error is thrown again).
   */
  tool<I, O>(name: string, input: I, fn: (input: I) => O | Promise<O>): Promise<O>
  /** Free-form metadata for this turn (token usage, the model used, …). */
  metadata(data: Record<string, unknown>): void
  /** Ends the turn. Sent for you when the turns() loop moves on; a second call is a no-op. */
  done(): void
  /** Ends the turn as failed with this message; the agent keeps running for the next turn. */
  error(message: string | Error): void
}

/**
 * One Turn per user message, for the life of the process; sends `ready` first. Once started,
 * `process.stdout.write` (and console.log) goes to stderr: stdout carries the protocol's frames.
 */
export declare function turns(): AsyncGenerator<Turn, void, undefined>

/**
 * Wraps `fn` so every call is a reported tool call on the current turn (input: the first argument;
 * further arguments are passed through).
 */
export declare function tool<I, R extends unknown[], O>(
  name: string,
  fn: (input: I, ...rest: R) => O | Promise<O>,
): (input: I, ...rest: R) => Promise<Awaited<O>>

/** The session's turns before the current one (reads `$CAIRN_TRANSCRIPT`). */
export declare function transcript(): TranscriptLine[]

/** The turn being answered, if any. */
export declare function currentTurn(): Turn | undefined

declare const kit: {
  Turn: typeof Turn
  turns: typeof turns
  tool: typeof tool
  transcript: typeof transcript
  currentTurn: typeof currentTurn
}
export default kit
