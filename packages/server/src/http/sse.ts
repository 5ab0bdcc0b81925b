import type { ServerResponse } from 'node:http'
import { CairnProblem, encodeSse, type StreamEvent } from '@cairn/protocol'
import { drained } from '@cairn/runtime/port'

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
 * Resolves once `res` drained what it buffers (or closed, errored); a client that drains nothing
 * for `stallMs` has its connection cut (it picks the stream up again with `Last-Event-ID`).
 */
export async function whenDrained(res: ServerResponse, stallMs: number): Promise<void> {
  await drained(res, { stallMs })
}

/** How long the headers wait for the stream's first event to go out with it. */
export const SSE_HEADERS_WAIT_MS = 20
/**
 * How long a run's `run.started` waits for the run's first output (or its end) to go out with it:
 * a warm turn's reply then reaches the client in one write with it.
 */
export const RUN_STARTED_HOLD_MS = 5
/** Events held for one write at most this many bytes: more is written at once. */
const COALESCE_BYTES = 16 * 1024

/**
 * The one SSE writer of the API: every streaming route writes through it. It sends the headers,
 * a `heartbeat` event on an interval, and stops writing (not running) once the client has gone or
 * the stream has ended, so a late event is dropped instead of written to a dead socket. A write
 * the socket cannot take now answers a promise of its drain: the caller waits for it before the
 * next (back-pressure down to the agent), and a client that reads nothing is cut after `stallMs`.
 *
 * Each write to the socket wakes the client, so writes are coalesced: the headers go with the
 * first event (or after `SSE_HEADERS_WAIT_MS` without one: a cold start, a setup phase), and the
 * events sent in one pass of the event loop go in one write (a run's last event with the end of
 * the response). Nothing waits for a timer but the headers and a `run.started` (up to
 * `RUN_STARTED_HOLD_MS`, for the run's first output): any other event goes out, with whatever is
 * pending, before the loop next polls for I/O.
 */
export class SseWriter {
  private done = false
  private drained: Promise<void> | undefined
  private readonly stallMs: number
  private readonly heartbeat: NodeJS.Timeout
  private readonly closeListeners: (() => void)[] = []
  /** Events not written yet (one write at the end of this pass of the event loop). */
  private pending: string[] = []
  private pendingBytes = 0
  private flushing: NodeJS.Immediate | undefined
  private holding: NodeJS.Timeout | undefined
  private headersTimer: NodeJS.Timeout | undefined

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
    res.socket?.setNoDelay(true)
    this.headersTimer = setTimeout(() => {
      this.headersTimer = undefined
      if (!this.closed && !res.headersSent) res.flushHeaders()
    }, SSE_HEADERS_WAIT_MS)
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
    return this.write(encodeSse(event, id), event.type === 'run.started')
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

  private write(text: string, hold = false): Promise<void> | undefined {
    if (this.closed) return undefined
    this.pending.push(text)
    this.pendingBytes += text.length
    if (this.pendingBytes >= COALESCE_BYTES) return this.flush()
    if (hold) this.holding ??= setTimeout(() => this.flush(), RUN_STARTED_HOLD_MS)
    else this.flushing ??= setImmediate(() => this.flush())
    // Behind already (a heartbeat, an event sent without waiting): the same wait.
    return this.drained
  }

  /** Writes what is pending in one write; a promise of its drain when the socket is behind. */
  private flush(): Promise<void> | undefined {
    this.cancelFlush()
    const text = this.pending.join('')
    this.pending = []
    this.pendingBytes = 0
    if (this.closed || text === '') return this.drained
    if (this.res.write(text) || this.drained) return this.drained
    this.drained = whenDrained(this.res, this.stallMs).finally(() => {
      this.drained = undefined
    })
    return this.drained
  }

  private cancelFlush(): void {
    if (this.flushing) clearImmediate(this.flushing)
    if (this.holding) clearTimeout(this.holding)
    this.flushing = undefined
    this.holding = undefined
  }

  end(): void {
    if (!this.closed) {
      // What is pending and the end of the response in one write.
      this.cancelFlush()
      this.res.end(this.pending.join(''))
      this.pending = []
      this.pendingBytes = 0
    }
    this.finish()
  }

  private finish(): void {
    if (this.done) return
    this.done = true
    clearInterval(this.heartbeat)
    if (this.headersTimer) clearTimeout(this.headersTimer)
    this.cancelFlush()
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
