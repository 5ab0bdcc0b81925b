/**
 * A Server-Sent Events parser following the WHATWG event-stream rules: lines end in LF, CRLF or CR
 * (also when the CR and LF arrive in different chunks), `:` starts a comment, `data:` lines are joined
 * with newlines, a blank line dispatches, and an event left unterminated at the end is dropped.
 * Pure: no I/O, fed with decoded text.
 */
export interface SseMessage {
  event: string
  data: string
  id?: string
  retry?: number
}

export class SseParser {
  private buffer = ''
  private skipLeadingLf = false
  private started = false
  private event = ''
  private data: string[] = []
  private id: string | undefined
  private retry: number | undefined

  /** Feeds decoded text; returns the events completed by it. */
  push(chunk: string): SseMessage[] {
    let text = chunk
    if (!this.started && text.length > 0) {
      this.started = true
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1)
    }
    if (this.skipLeadingLf && text.length > 0) {
      this.skipLeadingLf = false
      if (text[0] === '\n') text = text.slice(1)
    }
    this.buffer += text
    const out: SseMessage[] = []
    let start = 0
    for (let i = 0; i < this.buffer.length; i++) {
      const ch = this.buffer[i]
      if (ch !== '\n' && ch !== '\r') continue
      const line = this.buffer.slice(start, i)
      if (ch === '\r') {
        if (i + 1 < this.buffer.length) {
          if (this.buffer[i + 1] === '\n') i++
        } else {
          this.skipLeadingLf = true
        }
      }
      start = i + 1
      const message = this.line(line)
      if (message) out.push(message)
    }
    this.buffer = this.buffer.slice(start)
    return out
  }

  /** The end of the stream: a final event without its blank line is incomplete and dropped. */
  end(): SseMessage[] {
    this.buffer = ''
    this.reset()
    return []
  }

  private line(line: string): SseMessage | undefined {
    if (line === '') return this.dispatch()
    if (line.startsWith(':')) return undefined
    const colon = line.indexOf(':')
    const field = colon < 0 ? line : line.slice(0, colon)
    let value = colon < 0 ? '' : line.slice(colon + 1)
    if (value.startsWith(' ')) value = value.slice(1)
    switch (field) {
      case 'event':
        this.event = value
        break
      case 'data':
        this.data.push(value)
        break
      case 'id':
        if (!value.includes('\0')) this.id = value
        break
      case 'retry':
        if (/^\d+$/.test(value)) this.retry = Number(value)
        break
    }
    return undefined
  }

  private dispatch(): SseMessage | undefined {
    if (this.data.length === 0) {
      this.event = ''
      return undefined
    }
    const message: SseMessage = { event: this.event || 'message', data: this.data.join('\n') }
    if (this.id !== undefined) message.id = this.id
    if (this.retry !== undefined) message.retry = this.retry
    this.reset()
    return message
  }

  private reset(): void {
    this.event = ''
    this.data = []
    this.retry = undefined
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
    if (!done) await reader.cancel().catch(() => undefined)
    reader.releaseLock()
  }
}
