import type { ServerResponse } from 'node:http'
import { CairnProblem, encodeSse, type StreamEvent } from '@cairn/protocol'

/** How often an idle stream gets a `heartbeat` event (keeps proxies from timing it out). */
export const DEFAULT_SSE_HEARTBEAT_MS = 15_000
/** How long a client may read nothing of a full stream before its connection is cut. */
export const DEFAULT_SSE_STALL_MS = 60_000

export interface SseWriterOptions {
  /** Interval of the `heartbeat` events, in ms (default 15 s). */
  heartbeatMs?: number | undefined
  /** A client that drains nothing of a full stream for this long is cut (default 60 s). */
  stallMs?: number | undefined
  /**
   * How the heartbeat is written: a `heartbeat` event (Cairn's streams, default) or an SSE comment
   * line (streams of other protocols, whose clients parse every event's data: A2A, AG-UI).
   */
  heartbeat?: 'event' | 'comment' | undefined
}

/**
 * Resolves once `res` drained what it buffers (or closed); a client that drains nothing for
 * `stallMs` has its connection cut (it picks the stream up again with `Last-Event-ID`).
 */
export function whenDrained(res: ServerResponse, stallMs: number): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(stall)
      res.off('drain', done)
      res.off('close', done)
      resolve()
    }
    const stall = setTimeout(() => {
      done()
      res.destroy()
    }, stallMs)
    res.once('drain', done)
    res.once('close', done)
  })
}

/**
 * The one SSE writer of the API: every streaming route writes through it. It sends the headers,
 * a `heartbeat` event on an interval, and stops writing (not running) once the client has gone or
 * the stream has ended, so a late event is dropped instead of written to a dead socket. A write
 * the socket cannot take now answers a promise of its drain: the caller waits for it before the
 * next (back-pressure down to the agent), and a client that reads nothing is cut after `stallMs`.
 */
export class SseWriter {
  private done = false
  private drained: Promise<void> | undefined
  private readonly stallMs: number
  private readonly heartbeat: NodeJS.Timeout
  private readonly closeListeners: (() => void)[] = []

  constructor(
    private readonly res: ServerResponse,
    options: SseWriterOptions = {},
  ) {
    this.stallMs = options.stallMs ?? DEFAULT_SSE_STALL_MS
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache, no-transform',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    })
    res.flushHeaders()
    res.socket?.setNoDelay(true)
    res.on('close', () => this.finish())
    // A write racing the socket's teardown fails here, not as an uncaught 'error': the close above
    // follows and stops the stream.
    res.on('error', () => this.finish())
    const beat =
      options.heartbeat === 'comment'
        ? () => this.write(': heartbeat\n\n')
        : () => this.send({ type: 'heartbeat', at: new Date().toISOString() })
    this.heartbeat = setInterval(beat, options.heartbeatMs ?? DEFAULT_SSE_HEARTBEAT_MS)
    this.heartbeat.unref()
  }

  /** True once the client has gone or `end()` was called: nothing more is written. */
  get closed(): boolean {
    return this.done || this.res.destroyed || this.res.writableEnded
  }

  /** Runs `listener` once when the stream stops (client gone or ended); at once if it already has. */
  onClose(listener: () => void): void {
    if (this.done) listener()
    else this.closeListeners.push(listener)
  }

  /**
   * Sends a stream event (its type is the SSE event name), with its `id:` when it has one; a
   * promise when the client is behind: the next event waits for it.
   */
  send(event: StreamEvent, id?: number): Promise<void> | undefined {
    return this.write(encodeSse(event, id))
  }

  /** Sends a named event whose data is `data` as JSON (streams that are not runs: build logs). */
  sendNamed(name: string, data: unknown, id?: number): Promise<void> | undefined {
    const idLine = id === undefined ? '' : `id: ${id}\n`
    return this.write(`event: ${name}\n${idLine}data: ${JSON.stringify(data)}\n\n`)
  }

  /** Sends an unnamed event whose data is `data` as JSON (the framing A2A and AG-UI clients read). */
  sendData(data: unknown): Promise<void> | undefined {
    return this.write(`data: ${JSON.stringify(data)}\n\n`)
  }

  private write(text: string): Promise<void> | undefined {
    if (this.closed) return undefined
    if (this.drained) {
      // Behind already (a heartbeat, an event sent without waiting): written, the same wait.
      this.res.write(text)
      return this.drained
    }
    if (this.res.write(text)) return undefined
    this.drained = whenDrained(this.res, this.stallMs).finally(() => {
      this.drained = undefined
    })
    return this.drained
  }

  end(): void {
    if (!this.closed) this.res.end()
    this.finish()
  }

  private finish(): void {
    if (this.done) return
    this.done = true
    clearInterval(this.heartbeat)
    for (const listener of this.closeListeners.splice(0)) listener()
  }
}

/**
 * Where a resumed stream starts: after `Last-Event-ID` when sent (an EventSource reconnecting to a
 * URL with `after` sends it, and it is the newer), else after `after`, else from the start.
 */
export function eventIdAfter(header: string | string[] | undefined, after: number | undefined): number {
  const value = Array.isArray(header) ? header.at(-1) : header
  if (value === undefined || value.trim() === '') return after ?? 0
  if (!/^\d{1,15}$/.test(value.trim()))
    throw new CairnProblem(
      'validation_failed',
      `Last-Event-ID must be the id of an event of this stream (a whole number), not '${value.slice(0, 40)}'`,
    )
  return Number(value.trim())
}
