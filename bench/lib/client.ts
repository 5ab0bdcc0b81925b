import http from 'node:http'
import { SseParser } from '@cairn/sdk'

/** Timings of one streamed run, in ms from the moment the request was issued. */
export interface StreamTiming {
  status: number
  headersMs: number
  runStartedMs: number | undefined
  firstDeltaMs: number | undefined
  completedMs: number | undefined
  endMs: number
  /** The server's own figure, from `run.completed` (or `run.failed`). */
  serverDurationMs: number | undefined
  coldStart: boolean | undefined
  terminal: string | undefined
  text: string
  error: string | undefined
}

export interface JsonResponse {
  status: number
  // biome-ignore lint/suspicious/noExplicitAny: bench convenience, the server's answers are checked by status
  body: any
  ms: number
}

/** Reads an SSE stream (the SDK's parser) and stamps each event with the time its chunk arrived. */
class SseTimer {
  private readonly parser = new SseParser()
  readonly timing: StreamTiming

  constructor(
    private readonly t0: number,
    status: number,
  ) {
    this.timing = {
      status,
      headersMs: performance.now() - t0,
      runStartedMs: undefined,
      firstDeltaMs: undefined,
      completedMs: undefined,
      endMs: 0,
      serverDurationMs: undefined,
      coldStart: undefined,
      terminal: undefined,
      text: '',
      error: undefined,
    }
  }

  push(chunk: string): void {
    const at = performance.now() - this.t0
    for (const message of this.parser.push(chunk)) {
      const event = JSON.parse(message.data) as {
        type: string
        content?: string
        durationMs?: number
        coldStart?: boolean
        error?: { message?: string }
      }
      const t = this.timing
      switch (event.type) {
        case 'run.started':
          t.runStartedMs ??= at
          t.coldStart = event.coldStart
          break
        case 'message.delta':
          t.firstDeltaMs ??= at
          t.text += event.content ?? ''
          break
        case 'run.completed':
        case 'run.failed':
        case 'run.cancelled':
          t.completedMs ??= at
          t.terminal = event.type
          t.serverDurationMs = event.durationMs
          if (event.error) t.error = event.error.message
          break
      }
    }
  }

  finish(): StreamTiming {
    this.timing.endMs = performance.now() - this.t0
    return this.timing
  }
}

export interface Client {
  readonly kind: string
  json(method: string, route: string, body?: unknown): Promise<JsonResponse>
  stream(route: string, body: unknown): Promise<StreamTiming>
  close(): void
}

/** node:http with a keep-alive agent: the lightest client Node offers. */
export class NodeHttpClient implements Client {
  readonly kind = 'node:http keep-alive'
  private readonly agent: http.Agent
  private readonly base: URL

  /** @param maxSockets keep-alive connections at most: requests beyond it queue in the client. */
  constructor(
    url: string,
    private readonly key: string,
    maxSockets = 16,
  ) {
    this.base = new URL(url)
    this.agent = new http.Agent({ keepAlive: true, maxSockets, noDelay: true })
  }

  private send(
    method: string,
    route: string,
    body: unknown,
    onResponse: (res: http.IncomingMessage, t0: number) => void,
    reject: (error: Error) => void,
    extraHeaders: http.OutgoingHttpHeaders = {},
  ): void {
    let payload: Buffer | undefined
    let contentType: string | undefined
    if (Buffer.isBuffer(body)) {
      payload = body
      contentType = 'application/gzip'
    } else if (body !== undefined) {
      payload = Buffer.from(JSON.stringify(body))
      contentType = 'application/json'
    }
    const headers: http.OutgoingHttpHeaders = { authorization: `Bearer ${this.key}`, ...extraHeaders }
    if (payload) {
      headers['content-type'] = contentType
      headers['content-length'] = payload.length
    }
    const t0 = performance.now()
    const req = http.request(
      {
        host: this.base.hostname,
        port: this.base.port,
        method,
        path: route,
        headers,
        agent: this.agent,
      },
      (res) => onResponse(res, t0),
    )
    req.on('error', reject)
    req.end(payload)
  }

  /** `headers` are sent besides the key (a preview's `Host`, for one). */
  json(
    method: string,
    route: string,
    body?: unknown,
    headers?: http.OutgoingHttpHeaders,
  ): Promise<JsonResponse> {
    return new Promise((resolve, reject) => {
      this.send(
        method,
        route,
        body,
        (res, t0) => {
          const chunks: Buffer[] = []
          res.on('data', (c: Buffer) => chunks.push(c))
          res.on('error', reject)
          res.on('end', () => {
            const ms = performance.now() - t0
            const text = Buffer.concat(chunks).toString('utf8')
            let parsed: unknown = text
            try {
              parsed = JSON.parse(text)
            } catch {
              // not JSON
            }
            resolve({ status: res.statusCode ?? 0, body: parsed, ms })
          })
        },
        reject,
        headers,
      )
    })
  }

  stream(route: string, body: unknown): Promise<StreamTiming> {
    return new Promise((resolve, reject) => {
      this.send(
        'POST',
        route,
        body,
        (res, t0) => {
          const timer = new SseTimer(t0, res.statusCode ?? 0)
          res.setEncoding('utf8')
          res.on('data', (c: string) => timer.push(c))
          res.on('error', reject)
          res.on('end', () => resolve(timer.finish()))
        },
        reject,
      )
    })
  }

  close(): void {
    this.agent.destroy()
  }
}

/** The global fetch (undici, keep-alive by default): what the SDK uses. */
export class FetchClient implements Client {
  readonly kind = 'fetch (undici) keep-alive'

  constructor(
    private readonly url: string,
    private readonly key: string,
  ) {}

  private init(method: string, body: unknown): RequestInit {
    const headers: Record<string, string> = { authorization: `Bearer ${this.key}` }
    const init: RequestInit = { method, headers }
    if (Buffer.isBuffer(body)) {
      headers['content-type'] = 'application/gzip'
      init.body = body
    } else if (body !== undefined) {
      headers['content-type'] = 'application/json'
      init.body = JSON.stringify(body)
    }
    return init
  }

  async json(method: string, route: string, body?: unknown): Promise<JsonResponse> {
    const t0 = performance.now()
    const res = await fetch(this.url + route, this.init(method, body))
    const text = await res.text()
    const ms = performance.now() - t0
    let parsed: unknown = text
    try {
      parsed = JSON.parse(text)
    } catch {
      // not JSON
    }
    return { status: res.status, body: parsed, ms }
  }

  async stream(route: string, body: unknown): Promise<StreamTiming> {
    const t0 = performance.now()
    const res = await fetch(this.url + route, this.init('POST', body))
    const timer = new SseTimer(t0, res.status)
    if (res.body) {
      const decoder = new TextDecoder()
      for await (const chunk of res.body) timer.push(decoder.decode(chunk as Uint8Array, { stream: true }))
    }
    return timer.finish()
  }

  close(): void {}
}
