import type { StreamEvent, ToolCall } from '@cairn/protocol'
import { AbortError, CairnError, ConnectionError, TimeoutError } from './errors.js'

export type FinishReason = 'completed' | 'failed' | 'cancelled'

/** What a turn came to. A failed or cancelled turn resolves too; only transport and request errors throw. */
export interface RunResult {
  text: string
  toolCalls: ToolCall[]
  finishReason: FinishReason
  durationMs: number
  sessionId: string
  turn?: number
  turnId?: string
  /** Why the run failed (`finishReason: 'failed'`). */
  error?: { code: string; message: string }
}

/** A run's stream as it is opened (or picked up again). */
export interface OpenedRun {
  sessionId: string
  /** The turn (the `Cairn-Turn-Id` header); else the `run.started` event names it. */
  turnId?: string | undefined
  events: AsyncIterable<StreamEvent>
  /** The SSE id of the event `events` yielded last (undefined for one without: a heartbeat). */
  eventId?(): number | undefined
  close(): void
}

/** What a stream does when its connection drops before the run's end. */
export interface ReconnectOptions {
  /**
   * How many times in a row a dropped stream is picked up again (`GET …/turns/{turnId}/events`
   * after the last event received), waiting 250 ms, 0.5 s, 1 s … (at most 5 s) before each;
   * the count starts again with each event received. Default 5; 0 turns reconnecting off.
   */
  maxReconnects?: number | undefined
  /** Told before each reconnect (to say so: the CLI prints a line). */
  onReconnect?: ((info: ReconnectInfo) => void) | undefined
}

export interface ReconnectInfo {
  /** 1 for the first try after a drop. */
  attempt: number
  maxAttempts: number
  turnId: string
  /** The id of the last event received: the stream goes on after it. */
  afterEventId: number
  /** How long it waits before this try. */
  delayMs: number
  /** Why: the connection's error, or undefined when the stream ended early. */
  cause: unknown
}

export const DEFAULT_MAX_RECONNECTS = 5
const RECONNECT_BASE_MS = 250
const RECONNECT_MAX_MS = 5000

/** How an `AgentStream` opens, cancels and finishes its run; the client supplies it. */
export interface StreamDriver {
  /** Opens the run. `signal` aborts the request while it is being opened. */
  open(signal: AbortSignal): Promise<OpenedRun>
  /**
   * Picks the run's stream up again after event `afterEventId`, once its connection dropped;
   * without it a dropped stream fails with `ConnectionError`.
   */
  resume?(turnId: string, afterEventId: number, signal: AbortSignal): Promise<OpenedRun>
  /** Asks the server to cancel the running turn (no-op when nothing was started). */
  cancel(): Promise<void>
  /** Runs once the run is over, before `result` settles (ends a session the stream created). */
  finish?(): Promise<void>
}

/** How long `abort()` waits for the server's `run.cancelled` before cutting the connection. */
const CANCEL_GRACE_MS = 3000

/**
 * One run, streamed: an async iterable of events (replayed from the start for every iterator), its
 * text as `textStream`, and `result`. Reading starts at once, so `result` settles even when nobody
 * iterates. `abort()` (or the call's `signal`) cancels the turn on the server and resolves
 * `finishReason: 'cancelled'`. A connection that drops before the run's end is picked up again
 * after the last event received (see `ReconnectOptions`): every event is yielded once.
 */
export class AgentStream implements AsyncIterable<StreamEvent> {
  readonly result: Promise<RunResult>
  private readonly events: StreamEvent[] = []
  private wake: (() => void)[] = []
  private ended = false
  private failure: unknown
  private aborting = false
  private opened: { sessionId: string; close(): void } | undefined
  /** Reconnects tried since the last event received. */
  private failures = 0
  /** The id of the last event received (0: none). */
  private lastEventId = 0
  /** How many times the stream was picked up again. */
  reconnects = 0
  /** Ends the wait before a reconnect (set while it waits). */
  private wakeReconnect: (() => void) | undefined
  private readonly opener = new AbortController()
  private readonly startedAt = Date.now()
  private sessionId = ''

  constructor(
    private readonly driver: StreamDriver,
    signal?: AbortSignal,
    private readonly reconnect: ReconnectOptions = {},
  ) {
    const onAbort = () => void this.abort()
    if (signal?.aborted) this.aborting = true
    else signal?.addEventListener('abort', onAbort, { once: true })
    this.result = this.pump()
    // Handled where `result` is awaited; this only keeps a result nobody awaits from being reported
    // as an unhandled rejection (the same failure also ends the event iteration).
    this.result.catch(() => undefined)
    if (signal) void this.settled().then(() => signal.removeEventListener('abort', onAbort))
  }

  [Symbol.asyncIterator](): AsyncIterator<StreamEvent> {
    let index = 0
    return {
      next: async () => {
        while (index >= this.events.length && !this.ended) await new Promise<void>((r) => this.wake.push(r))
        const event = this.events[index]
        if (event !== undefined) {
          index++
          return { value: event, done: false }
        }
        if (this.failure !== undefined) throw this.failure
        return { value: undefined, done: true }
      },
    }
  }

  /** Only the agent's text, chunk by chunk. */
  get textStream(): AsyncIterable<string> {
    const events = this
    return {
      async *[Symbol.asyncIterator]() {
        for await (const event of events) if (event.type === 'message.delta') yield event.content
      },
    }
  }

  /** Cancels the turn: asks the server, waits briefly for `run.cancelled`, then closes the connection. */
  async abort(): Promise<void> {
    if (!this.aborting && !this.ended) {
      this.aborting = true
      this.wakeReconnect?.()
      if (this.opened === undefined) {
        this.opener.abort()
      } else {
        // A failed cancel request still ends the run: the connection is closed after the grace.
        await this.driver.cancel().catch(() => undefined)
        let timer: ReturnType<typeof setTimeout> | undefined
        await Promise.race([this.settled(), new Promise((r) => (timer = setTimeout(r, CANCEL_GRACE_MS)))])
        clearTimeout(timer)
        this.opened.close()
      }
    }
    await this.settled()
  }

  private settled(): Promise<void> {
    return this.result.then(
      () => undefined,
      () => undefined,
    )
  }

  private push(event: StreamEvent): void {
    this.events.push(event)
    for (const w of this.wake.splice(0)) w()
  }

  private async pump(): Promise<RunResult> {
    let terminal: StreamEvent | undefined
    try {
      if (this.aborting) throw new AbortError({ code: 'aborted', message: 'the run was aborted' })
      let opened = await this.driver.open(this.opener.signal)
      this.opened = opened
      this.sessionId = opened.sessionId
      const turnId = () => opened.turnId ?? this.turnId()
      if (this.aborting) void this.abortOpened()
      while (true) {
        const { end, broken } = await this.read(opened)
        terminal = end
        if (terminal !== undefined || this.aborting) break
        opened = await this.pickUp(turnId(), broken)
        this.opened = opened
      }
    } catch (error) {
      // Once aborting, a broken connection or an aborted fetch is the cancellation itself; only an
      // answer from the server (it has a status) is still an error worth reporting.
      if (!this.aborting || (error instanceof CairnError && error.status !== undefined)) this.failure = error
    }
    if (this.failure === undefined && terminal === undefined) {
      // Best effort for a run that may have started while its opening was aborted; the outcome is
      // `cancelled` whatever the server answers.
      if (this.opened === undefined) await this.driver.cancel().catch(() => undefined)
      terminal = { type: 'run.cancelled', turnId: this.turnId(), durationMs: Date.now() - this.startedAt }
      this.push(terminal)
    }
    // The run's outcome is settled; ending the session a stream created is housekeeping (the
    // server's idle timeout ends it anyway), so its failure does not turn the outcome into one.
    if (this.driver.finish) await this.driver.finish().catch(() => undefined)
    this.ended = true
    for (const w of this.wake.splice(0)) w()
    if (this.failure !== undefined) throw this.failure
    return this.toResult(terminal as StreamEvent)
  }

  /** Reads a stream until the run's terminal event, its end, or its connection's failure. */
  private async read(opened: OpenedRun): Promise<{ end?: StreamEvent; broken?: unknown }> {
    try {
      for await (const event of opened.events) {
        const id = opened.eventId?.()
        if (id !== undefined) {
          // Already received before the connection dropped.
          if (id <= this.lastEventId) continue
          this.lastEventId = id
          this.failures = 0
        }
        this.push(event)
        if (event.type === 'run.completed' || event.type === 'run.failed' || event.type === 'run.cancelled')
          return { end: event }
      }
      return {}
    } catch (error) {
      return { broken: error }
    } finally {
      opened.close()
    }
  }

  /**
   * The connection dropped before the run's end: picks the stream up after the last event
   * received, trying up to `maxReconnects` times with a growing wait. Throws what broke it when
   * it cannot (no turn known yet, reconnecting off, tries used up, an answer that is an error).
   */
  private async pickUp(turnId: string, broken: unknown): Promise<OpenedRun> {
    const maxAttempts = this.reconnect.maxReconnects ?? DEFAULT_MAX_RECONNECTS
    let cause = broken
    while (true) {
      if (this.driver.resume === undefined || turnId === '' || this.failures >= maxAttempts) {
        throw cause ?? streamEndedEarly()
      }
      const attempt = ++this.failures
      const delayMs = Math.min(RECONNECT_BASE_MS * 2 ** (attempt - 1), RECONNECT_MAX_MS)
      this.reconnect.onReconnect?.({
        attempt,
        maxAttempts,
        turnId,
        afterEventId: this.lastEventId,
        delayMs,
        cause,
      })
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, delayMs)
        // An abort does not wait for the try: the run is cancelled now.
        this.wakeReconnect = () => {
          clearTimeout(timer)
          resolve()
        }
      })
      this.wakeReconnect = undefined
      if (this.aborting) throw new AbortError({ code: 'aborted', message: 'the run was aborted' })
      try {
        const opened = await this.driver.resume(turnId, this.lastEventId, this.opener.signal)
        this.reconnects++
        return opened
      } catch (error) {
        // The server is back but refuses (the turn is gone, the key revoked): that is the answer.
        if (!(error instanceof ConnectionError || error instanceof TimeoutError) || !error.retryable)
          throw error
        cause = error
      }
    }
  }

  /** `abort()` arrived while the request was being opened: cancel now that the turn is known. */
  private async abortOpened(): Promise<void> {
    this.aborting = false
    await this.abort()
  }

  private turnId(): string {
    for (const e of this.events) if (e.type === 'run.started') return e.turnId
    return ''
  }

  private toResult(terminal: StreamEvent): RunResult {
    let text = ''
    const tools = new Map<string, ToolCall>()
    const result: RunResult = {
      text: '',
      toolCalls: [],
      finishReason: 'cancelled',
      durationMs: Date.now() - this.startedAt,
      sessionId: this.sessionId,
    }
    for (const event of this.events) {
      if (event.type === 'run.started') {
        result.turn = event.turn
        result.turnId = event.turnId
        if (event.sessionId) result.sessionId = event.sessionId
      } else if (event.type === 'message.delta') {
        text += event.content
      } else if (event.type === 'tool.start') {
        const call: ToolCall = { id: event.toolCallId, name: event.name }
        if (event.input !== undefined) call.input = event.input
        tools.set(event.toolCallId, call)
      } else if (event.type === 'tool.end') {
        const call = tools.get(event.toolCallId) ?? { id: event.toolCallId, name: '' }
        if (event.output !== undefined) call.output = event.output
        if (event.isError !== undefined) call.isError = event.isError
        if (event.durationMs !== undefined) call.durationMs = event.durationMs
        tools.set(event.toolCallId, call)
      }
    }
    result.text = text
    result.toolCalls = [...tools.values()]
    if (terminal.type === 'run.completed') {
      result.finishReason = 'completed'
      result.text = terminal.text
      result.durationMs = terminal.durationMs
    } else if (terminal.type === 'run.failed') {
      result.finishReason = 'failed'
      result.durationMs = terminal.durationMs
      result.error = { code: terminal.error.code, message: terminal.error.message }
    } else if (terminal.type === 'run.cancelled') {
      result.durationMs = terminal.durationMs
    }
    return result
  }
}

function streamEndedEarly(): ConnectionError {
  return new ConnectionError({
    code: 'connection_error',
    message: 'the stream ended before the run finished',
    retryable: true,
  })
}
