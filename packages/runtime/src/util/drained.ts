/** What ended a wait for a writable's drain. */
export type DrainEnd = 'drained' | 'closed' | 'errored' | 'stalled' | 'ended'

export interface DrainWait {
  /** A writable that drains nothing for this long is destroyed and the wait ends `stalled`. */
  stallMs?: number | undefined
  /** Ends the wait too, `ended` (the process behind the writable exited, …), settled or not. */
  until?: Promise<unknown> | undefined
}

/**
 * The side of a writable the wait reads: a `stream.Writable` (a child's stdin), an HTTP response,
 * an HTTP/2 stream. `closed` and `writableNeedDrain` are read when the writable has them.
 */
export interface Drainable {
  readonly destroyed: boolean
  readonly closed?: boolean
  readonly writableNeedDrain?: boolean
  once(event: 'drain' | 'close' | 'error', listener: (...args: unknown[]) => void): unknown
  off(event: 'drain' | 'close' | 'error', listener: (...args: unknown[]) => void): unknown
  destroy(): unknown
}

/**
 * Resolves once `stream` can take writes again or never will: it drained, closed, errored or was
 * destroyed (at once when it already is, or needs no drain), `until` settled, or it drained
 * nothing for `stallMs` (then it is destroyed). Never rejects: the caller looks at the writable
 * (or the answer) to know whether to write on. A `drain` alone is not enough to wait for: a
 * writable destroyed or closed mid-write never emits it.
 */
export function drained(stream: Drainable, wait: DrainWait = {}): Promise<DrainEnd> {
  if (stream.destroyed || stream.closed === true) return Promise.resolve('closed')
  if (stream.writableNeedDrain === false) return Promise.resolve('drained')
  return new Promise<DrainEnd>((resolve) => {
    let settled = false
    const settle = (end: DrainEnd) => {
      if (settled) return
      settled = true
      clearTimeout(stall)
      stream.off('drain', onDrain)
      stream.off('close', onClose)
      stream.off('error', onError)
      resolve(end)
    }
    const onDrain = () => settle('drained')
    const onClose = () => settle('closed')
    const onError = () => settle('errored')
    const stall =
      wait.stallMs === undefined
        ? undefined
        : setTimeout(() => {
            settle('stalled')
            stream.destroy()
          }, wait.stallMs)
    stream.once('drain', onDrain)
    stream.once('close', onClose)
    stream.once('error', onError)
    const ended = () => settle('ended')
    wait.until?.then(ended, ended)
  })
}
