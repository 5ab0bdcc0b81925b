import type { ServerResponse } from 'node:http'
import { encodeSse, type StreamEvent } from '@cairn/protocol'

const HEARTBEAT_MS = 15_000

/** Writes events to an SSE response; stops writing (not running) when the client goes away. */
export class SseWriter {
  private closed = false
  private readonly heartbeat: NodeJS.Timeout

  constructor(private readonly res: ServerResponse) {
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache, no-transform',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    })
    res.flushHeaders()
    res.socket?.setNoDelay(true)
    res.on('close', () => {
      this.closed = true
    })
    this.heartbeat = setInterval(
      () => this.send({ type: 'heartbeat', at: new Date().toISOString() }),
      HEARTBEAT_MS,
    )
    this.heartbeat.unref()
  }

  send(event: StreamEvent): void {
    if (this.closed) return
    this.res.write(encodeSse(event))
  }

  end(): void {
    clearInterval(this.heartbeat)
    if (!this.closed) this.res.end()
    this.closed = true
  }
}
