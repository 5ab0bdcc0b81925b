import type { AgentEvent, TurnOutcome } from '../agent/types.js'
import type { AgentInfo } from './runtime-port.js'

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

/**
 * A running turn as an async iterable of its messages (`first` before any; `start` answering
 * nothing: no outcome, as after `cold`): `start` runs it at once (not when the
 * iteration begins), its events are queued until read; a turn that could not run ends the
 * iteration with its error. A reader that stops before the outcome cancels the turn (`cancel`).
 */
export function turnStream(
  start: (onEvent: (event: AgentEvent) => void) => Promise<TurnEnd | undefined>,
  cancel: () => void,
  first?: TurnMessage,
): AsyncIterable<TurnMessage> {
  const queue: TurnMessage[] = first ? [first] : []
  let finished = false
  let failure: { error: unknown } | undefined
  let wake: (() => void) | undefined
  const notify = () => {
    const waiting = wake
    wake = undefined
    waiting?.()
  }
  start((event) => {
    queue.push({ type: 'event', event })
    notify()
  })
    .then(
      (end) => {
        if (end) queue.push(end)
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
