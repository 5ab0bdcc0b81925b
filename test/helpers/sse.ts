import { type SseMessage, SseParser } from '@cairn/sdk'

/**
 * Reads SSE messages from a response (the SDK's parser) until the body ends or `stop` says so;
 * then hangs up (the controller is aborted). Heartbeats are dropped.
 */
export async function readEvents(
  res: Response,
  controller?: AbortController,
  stop: (message: SseMessage) => boolean = () => false,
): Promise<{ messages: SseMessage[]; ended: boolean }> {
  const parser = new SseParser()
  const decoder = new TextDecoder()
  const messages: SseMessage[] = []
  const reader = (res.body as ReadableStream<Uint8Array>).getReader()
  try {
    while (true) {
      const chunk = await reader.read()
      const batch = chunk.done
        ? [...parser.push(decoder.decode()), ...parser.end()]
        : parser.push(decoder.decode(chunk.value, { stream: true }))
      for (const message of batch) {
        if (message.event === 'heartbeat') continue
        messages.push(message)
        if (stop(message)) return { messages, ended: false }
      }
      if (chunk.done) return { messages, ended: true }
    }
  } finally {
    controller?.abort()
    reader.releaseLock()
  }
}

/** The ids of messages, as numbers (NaN for one without). */
export const idsOf = (messages: SseMessage[]) => messages.map((m) => Number(m.id ?? Number.NaN))

/** The text of the `message.delta` messages, joined. */
export const deltaText = (messages: SseMessage[]) =>
  messages
    .filter((m) => m.event === 'message.delta')
    .map((m) => (JSON.parse(m.data) as { content: string }).content)
    .join('')
