import type { AgentEvent, TurnOutcome } from '../agent/types.js'

/** What a turn sends back as it runs: its events as they happen, then (last) its outcome. */
export type TurnMessage = { type: 'event'; event: AgentEvent } | { type: 'outcome'; outcome: TurnOutcome }

/**
 * A running turn as an async iterable of its messages: `start` runs it at once (not when the
 * iteration begins), its events are queued until read; a turn that could not run ends the
 * iteration with its error. A reader that stops before the outcome cancels the turn (`cancel`).
 */
export function turnStream(
  start: (onEvent: (event: AgentEvent) => void) => Promise<TurnOutcome>,
  cancel: () => void,
): AsyncIterable<TurnMessage> {
  const queue: TurnMessage[] = []
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
      (outcome) => {
        queue.push({ type: 'outcome', outcome })
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
