import { createParser, type EventSourceParser } from 'eventsource-parser'

/**
 * Server-Sent Events parsing, on the maintained `eventsource-parser` (WHATWG event-stream rules:
 * LF, CRLF or CR line ends, comments, multi-line data, a dropped unterminated final event). This
 * wrapper only collects its events per chunk and names unnamed ones `message`. Pure: no I/O, fed
 * with decoded text.
 */
export interface SseMessage {
  event: string
  data: string
  id?: string
  retry?: number
}

export class SseParser {
  private readonly parser: EventSourceParser
  private out: SseMessage[] = []
  private retry: number | undefined
  private started = false
  private endsInCr = false

  constructor() {
    this.parser = createParser({
      onRetry: (retry) => {
        this.retry = retry
      },
      onEvent: (event) => {
        const message: SseMessage = { event: event.event || 'message', data: event.data }
        if (event.id !== undefined) message.id = event.id
        if (this.retry !== undefined) message.retry = this.retry
        this.retry = undefined
        this.out.push(message)
      },
    })
  }

  /** Feeds decoded text; returns the events completed by it. */
  push(chunk: string): SseMessage[] {
    let text = chunk
    if (!this.started && text.length > 0) {
      this.started = true
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1)
    }
    if (text.length > 0) this.endsInCr = text.endsWith('\r')
    this.parser.feed(text)
    return this.out.splice(0)
  }

  /** The end of the stream: a final event without its blank line is incomplete and dropped. */
  end(): SseMessage[] {
    // A CR is a whole line end, but the parser holds a trailing one back in case an LF follows:
    // an LF completes it as the same line end.
    if (this.endsInCr) this.parser.feed('\n')
    this.parser.reset()
    this.retry = undefined
    return this.out.splice(0)
  }
}

/** Reads an SSE body (bytes) into messages. Cancels the body when the consumer stops early. */
export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseMessage> {
  const reader = body.getReader()
  const decoder = new TextDecoder()
  const parser = new SseParser()
  let done = false
  try {
    while (true) {
      const chunk = await reader.read()
      if (chunk.done) {
        done = true
        yield* parser.push(decoder.decode())
        yield* parser.end()
        return
      }
      yield* parser.push(decoder.decode(chunk.value, { stream: true }))
    }
  } finally {
    // The consumer stopped early: a cancel that fails (the body already errored) leaves nothing open.
    if (!done) await reader.cancel().catch(() => undefined)
    reader.releaseLock()
  }
}
