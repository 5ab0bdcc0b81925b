import type { StreamEvent } from '@cairn/protocol'
import type { RedactingStream, Redactor } from '@cairn/runtime/port'

/**
 * A turn's events on their way to the client and the event log, with the agent's secrets
 * redacted: the reply's text as one stream (a value split over several `message.delta` events is
 * caught; what may be the start of one waits for the next delta), every string inside other events
 * (tool inputs and outputs, statuses) on its own. Text held back goes out before any other event
 * and when the turn ends (`flush`).
 */
export class TurnRedaction {
  private readonly text: RedactingStream

  constructor(
    private readonly redactor: Redactor,
    private readonly turnId: string,
    /** Answers a promise when the client is behind (see `TurnEmit`). */
    private readonly emit: (event: StreamEvent) => Promise<void> | undefined,
  ) {
    this.text = redactor.stream()
  }

  /** Sends `event` redacted; a promise when the client is behind (the next event waits for it). */
  event(event: StreamEvent): Promise<void> | undefined {
    if (event.type === 'message.delta') {
      const content = this.text.write(event.content)
      return content ? this.emit({ ...event, content }) : undefined
    }
    const held = this.flush()
    const sent = this.emit(this.redactValues(event) as StreamEvent)
    return held && sent ? Promise.all([held, sent]).then(() => undefined) : (sent ?? held)
  }

  /** Sends what the reply's text held back. */
  flush(): Promise<void> | undefined {
    const content = this.text.end()
    return content ? this.emit({ type: 'message.delta', turnId: this.turnId, content }) : undefined
  }

  /** Every string inside `value` redacted (a copy). */
  redactValues(value: unknown): unknown {
    if (typeof value === 'string') return this.redactor.redact(value)
    if (Array.isArray(value)) return value.map((item) => this.redactValues(item))
    if (value !== null && typeof value === 'object')
      return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, this.redactValues(item)]))
    return value
  }
}
