import type { StreamEvent } from '@cairn/protocol'
import type { RedactingStream, Redactor } from '../secrets/redaction.js'

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
    private readonly emit: (event: StreamEvent) => void,
  ) {
    this.text = redactor.stream()
  }

  event(event: StreamEvent): void {
    if (event.type === 'message.delta') {
      const content = this.text.write(event.content)
      if (content) this.emit({ ...event, content })
      return
    }
    this.flush()
    this.emit(this.redactValues(event) as StreamEvent)
  }

  /** Sends what the reply's text held back. */
  flush(): void {
    const content = this.text.end()
    if (content) this.emit({ type: 'message.delta', turnId: this.turnId, content })
  }

  private redactValues(value: unknown): unknown {
    if (typeof value === 'string') return this.redactor.redact(value)
    if (Array.isArray(value)) return value.map((item) => this.redactValues(item))
    if (value !== null && typeof value === 'object')
      return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, this.redactValues(item)]))
    return value
  }
}
