import { eventChars, OutputGate } from '../agent/output-gate.js'
import type { AgentEvent, TurnOutcome } from '../agent/types.js'
import type { AgentInfo } from './agent-info.js'

/**
 * The turn's last message: its outcome and, when the turn was asked to (`TurnOptions.keepWarmMs`),
 * what became of its sandbox after it (`after.agent`: the agent still up and cooling down; absent:
 * none, a dead one was stopped).
 */
export type TurnEnd = {
  type: 'outcome'
  outcome: TurnOutcome
  /** `unchanged`: the answer to `TurnOptions.mark`, when one was given. */
  after?: { agent?: AgentInfo | undefined; unchanged?: boolean | undefined }
}

/**
 * What a turn sends back as it runs. With `TurnOptions.resume`, first the warm agent it took
 * (`started`), or `cold` alone when the session has none alive (nothing ran; `stopped`: a dead
 * one was stopped, as `stopAgent` does). Then its events as they
 * happen, then (last) its outcome.
 */
export type TurnMessage =
  | { type: 'started'; agent: AgentInfo }
  | { type: 'cold'; stopped: boolean }
  | { type: 'event'; event: AgentEvent }
  | TurnEnd

/** Characters of events queued for a turn's reader above which the agent's output is paused. */
export const TURN_QUEUE_HIGH_CHARS = 256 * 1024
/** …and below which it is read again. */
export const TURN_QUEUE_LOW_CHARS = 64 * 1024

/**
 * A running turn as an async iterable of its messages (`first` before any; `start` answering
 * nothing: no outcome, as after `cold`): `start` runs it at once (not when the
 * iteration begins), its events are queued until read; a turn that could not run ends the
 * iteration with its error. A reader that stops before the outcome cancels the turn (`cancel`).
 * The queue is bounded: over `TURN_QUEUE_HIGH_CHARS` the gate given to `start` closes (the
 * agent's output is not read), below `TURN_QUEUE_LOW_CHARS` it opens again.
 */
export function turnStream(
  start: (onEvent: (event: AgentEvent) => void, gate: OutputGate) => Promise<TurnEnd | undefined>,
  cancel: () => void,
  first?: TurnMessage,
): AsyncIterable<TurnMessage> {
  const queue: TurnMessage[] = first ? [first] : []
  /** The characters of each queued message, in the queue's order. */
  const sizes: number[] = first ? [0] : []
  const gate = new OutputGate()
  let queuedChars = 0
  let finished = false
  let failure: { error: unknown } | undefined
  let wake: (() => void) | undefined
  const notify = () => {
    const waiting = wake
    wake = undefined
    waiting?.()
  }
  start((event) => {
    const chars = eventChars(event)
    queue.push({ type: 'event', event })
    sizes.push(chars)
    queuedChars += chars
    if (queuedChars > TURN_QUEUE_HIGH_CHARS) gate.set(false)
    notify()
  }, gate)
    .then(
      (end) => {
        if (end) {
          queue.push(end)
          sizes.push(0)
        }
      },
      (error: unknown) => {
        failure = { error }
      },
    )
    .finally(() => {
      finished = true
      notify()
    })
  return {
    async *[Symbol.asyncIterator]() {
      try {
        for (;;) {
          let message = queue.shift()
          while (message) {
            queuedChars -= sizes.shift() ?? 0
            if (queuedChars < TURN_QUEUE_LOW_CHARS) gate.set(true)
            yield message
            message = queue.shift()
          }
          // Checked with the queue just drained and no await between: the outcome is queued
          // before `finished` is set, so nothing is left behind.
          if (finished) {
            if (failure) throw failure.error
            return
          }
          await new Promise<void>((resolve) => {
            wake = resolve
          })
        }
      } finally {
        if (!finished) cancel()
      }
    },
  }
}
