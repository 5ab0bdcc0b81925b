import type { StreamEvent, ToolCall } from '@cairn/protocol'
import { AbortError, CairnError, ConnectionError } from './errors.js'

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

/** How an `AgentStream` opens, cancels and finishes its run; the client supplies it. */
export interface StreamDriver {
  /** Opens the run. `signal` aborts the request while it is being opened. */
  open(signal: AbortSignal): Promise<{ sessionId: string; events: AsyncIterable<StreamEvent>; close(): void }>
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
 * `finishReason: 'cancelled'`.
 */
export class AgentStream implements AsyncIterable<StreamEvent> {
  readonly result: Promise<RunResult>
  private readonly events: StreamEvent[] = []
  private wake: (() => void)[] = []
  private ended = false
  private failure: unknown
  private aborting = false
  private opened: { sessionId: string; close(): void } | undefined
  private readonly opener = new AbortController()
  private readonly startedAt = Date.now()
  private sessionId = ''

  constructor(
    private readonly driver: StreamDriver,
    signal?: AbortSignal,
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
      const opened = await this.driver.open(this.opener.signal)
      this.opened = opened
      this.sessionId = opened.sessionId
      if (this.aborting) void this.abortOpened()
      try {
        for await (const event of opened.events) {
          this.push(event)
          if (
            event.type === 'run.completed' ||
            event.type === 'run.failed' ||
            event.type === 'run.cancelled'
          ) {
            terminal = event
            break
          }
        }
      } finally {
        opened.close()
      }
      if (terminal === undefined && !this.aborting) {
        throw new ConnectionError({
          code: 'connection_error',
          message: 'the stream ended before the run finished',
          retryable: true,
        })
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
