import http from 'node:http'
import type { AddressInfo } from 'node:net'

/** A request a webhook receiver got: its headers and raw body. */
export interface Received {
  path: string
  headers: Record<string, string>
  body: string
}

/**
 * A webhook receiver on 127.0.0.1: keeps every request and answers what `answer` says (200 by
 * default), so a test can refuse the first attempt at a message and accept the next.
 */
export class WebhookReceiver {
  readonly received: Received[] = []
  answer: (request: Received) => number = () => 200
  private readonly server = http.createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      const request = {
        path: req.url ?? '',
        headers: Object.fromEntries(Object.entries(req.headers).map(([k, v]) => [k, String(v)])),
        body: Buffer.concat(chunks).toString('utf8'),
      }
      this.received.push(request)
      res.statusCode = this.answer(request)
      res.end('ok')
    })
  })

  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/hooks`
  }

  async listen(port = 0): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(port, '127.0.0.1', resolve))
    return this
  }

  /** The requests whose body has `type`. */
  ofType(type: string): Received[] {
    return this.received.filter((r) => (JSON.parse(r.body) as { type: string }).type === type)
  }

  /** Waits until `check` holds for what was received (at most `timeoutMs`). */
  async until<T>(check: (received: Received[]) => T | undefined, timeoutMs = 20_000): Promise<T> {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const found = check(this.received)
      if (found !== undefined && found !== false) return found
      if (Date.now() > deadline)
        throw new Error(`the receiver did not get what was awaited: ${this.received.length} requests`)
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  }

  async close(): Promise<void> {
    this.server.closeAllConnections()
    await new Promise<void>((resolve) => this.server.close(() => resolve()))
  }
}
