import type { StreamEvent } from '@cairn/protocol'
import { SseParser } from '@cairn/sdk'

/** An invariant the model test found broken (fast-check then shrinks the sequence that broke it). */
export class Violation extends Error {
  override name = 'Violation'
}

/** The server could not be reached or the connection broke (a fault did it, or the client aborted). */
export class ConnectionLost extends Error {
  override name = 'ConnectionLost'
}

export interface Answer {
  status: number
  // biome-ignore lint/suspicious/noExplicitAny: JSON answers are checked field by field
  body: any
  bytes: Buffer
}

export const TERMINAL = ['run.completed', 'run.failed', 'run.cancelled'] as const

export interface TurnOutcome {
  /** The HTTP status (200 when the run streamed). */
  status: number
  // biome-ignore lint/suspicious/noExplicitAny: the problem body of a refusal
  body: any
  events: StreamEvent[]
  /** `run.completed`, `run.failed` or `run.cancelled`; undefined when the stream ended without one. */
  terminal: string | undefined
  /** Set when the stream broke (a fault, or `abort`) before its end. */
  broken: boolean
}

/** A turn whose SSE answer is being read. */
export interface TurnStream {
  /** Resolves with the HTTP status once the answer's head came (0: no answer). */
  head: Promise<number>
  /** Resolves at the stream's first run event (or when the answer is a refusal or broke). */
  started: Promise<void>
  done: Promise<TurnOutcome>
  /** Drops the client connection (the fetch is aborted). */
  abort(): void
}

/**
 * The API as a client sees it, raw HTTP (so what is asserted is the wire). Every answer of 500 or
 * more is a violation at once: the model test's "no 5xx, ever" (but for `503`s with a code in
 * `allowed503`, which a fault step sets while its fault lasts: a database down answers
 * `unavailable`, a stopped node `node_lost`, as documented).
 * Requests share keep-alive connections (fetch's default). With several URLs (API replicas) each
 * request goes to one of them at random (`pick`, a seeded generator, so a replay routes alike).
 */
export class ModelClient {
  /** Codes of `503` answers returned as answers rather than violations (a fault step's window). */
  allowed503: readonly string[] = []

  constructor(
    /** The API's URLs: one server's, or every replica's (a restarted replica's is replaced in place). */
    readonly urls: string[],
    readonly key: string,
    private readonly pick: () => number = Math.random,
  ) {}

  /** A client of the `index`th URL alone (an operation in flight through one replica). */
  via(index: number): ModelClient {
    const one = new ModelClient([this.urls[index % this.urls.length] as string], this.key)
    one.allowed503 = this.allowed503
    return one
  }

  private get url(): string {
    return this.urls[Math.floor(this.pick() * this.urls.length) % this.urls.length] as string
  }

  private isViolation(status: number, body: unknown): boolean {
    if (status < 500) return false
    const code = (body as { error?: { code?: unknown } } | undefined)?.error?.code
    return !(status === 503 && typeof code === 'string' && this.allowed503.includes(code))
  }

  async call(
    method: string,
    route: string,
    body?: unknown,
    contentType = 'application/json',
  ): Promise<Answer> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.key}` }
    let payload: BodyInit | undefined
    if (body !== undefined) {
      headers['content-type'] = contentType
      payload = Buffer.isBuffer(body) ? new Uint8Array(body) : JSON.stringify(body)
    }
    let res: Response
    let bytes: Buffer
    const url = this.url
    try {
      res = await fetch(url + route, {
        method,
        headers,
        ...(payload === undefined ? {} : { body: payload }),
      })
      bytes = Buffer.from(await res.arrayBuffer())
    } catch (error) {
      throw new ConnectionLost(
        `${method} ${url}${route}: ${String(error)} (${String((error as Error).cause ?? '')})`,
      )
    }
    const json = parseJson(bytes.toString('utf8'))
    if (this.isViolation(res.status, json))
      throw new Violation(
        `5xx: ${method} ${route} answered ${res.status} ${bytes.toString('utf8').slice(0, 500)}`,
      )
    return { status: res.status, body: json, bytes }
  }

  /** Sends `prompt` to the session and reads the SSE answer as it comes. */
  startTurn(sessionId: string, prompt: string): TurnStream {
    const controller = new AbortController()
    let markStarted: () => void = () => undefined
    const started = new Promise<void>((resolve) => {
      markStarted = resolve
    })
    let markHead: (status: number) => void = () => undefined
    const head = new Promise<number>((resolve) => {
      markHead = resolve
    })
    const done = this.readTurn(sessionId, prompt, controller.signal, markStarted, markHead).finally(() => {
      markHead(0)
      markStarted()
    })
    return { head, started, done, abort: () => controller.abort() }
  }

  private async readTurn(
    sessionId: string,
    prompt: string,
    signal: AbortSignal,
    onStarted: () => void,
    onHead: (status: number) => void,
  ): Promise<TurnOutcome> {
    const route = `/v1/sessions/${sessionId}/messages`
    const outcome: TurnOutcome = {
      status: 0,
      body: undefined,
      events: [],
      terminal: undefined,
      broken: false,
    }
    let res: Response
    try {
      res = await fetch(this.url + route, {
        method: 'POST',
        headers: { authorization: `Bearer ${this.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ prompt }),
        signal,
      })
    } catch {
      outcome.broken = true
      return outcome
    }
    outcome.status = res.status
    onHead(res.status)
    if (!res.headers.get('content-type')?.startsWith('text/event-stream')) {
      const text = await res.text().catch(() => '')
      outcome.body = parseJson(text)
      if (this.isViolation(res.status, outcome.body))
        throw new Violation(`5xx: POST ${route} answered ${res.status} ${text.slice(0, 500)}`)
      return outcome
    }
    const parser = new SseParser()
    const take = (messages: { event: string; data: string }[]) => {
      for (const message of messages) {
        const event = JSON.parse(message.data) as StreamEvent
        if (event.type === 'heartbeat') continue
        outcome.events.push(event)
        onStarted()
        if ((TERMINAL as readonly string[]).includes(event.type)) outcome.terminal = event.type
      }
    }
    const decoder = new TextDecoder()
    try {
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        take(parser.push(decoder.decode(chunk, { stream: true })))
      }
      take(parser.end())
    } catch {
      outcome.broken = true
    }
    if (outcome.terminal === undefined) outcome.broken = true
    return outcome
  }
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}
