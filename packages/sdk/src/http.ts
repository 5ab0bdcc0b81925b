import { AbortError, ConnectionError, errorFromBody, InvalidResponseError, TimeoutError } from './errors.js'

/**
 * What the client reads of an answer. The global fetch's `Response` is one; a `fetch` passed in
 * may answer a lighter object with these members (the CLI's, over node:http).
 */
export interface FetchResponse {
  readonly ok: boolean
  readonly status: number
  readonly headers: { get(name: string): string | null }
  readonly body: ReadableStream<Uint8Array> | null
  text(): Promise<string>
}

export type FetchLike = (input: string, init: RequestInit) => Promise<FetchResponse>

/** What every call accepts. */
export interface RequestOptions {
  signal?: AbortSignal | undefined
  /** Overrides the client's `timeoutMs` for this call (for streams: until the response starts). */
  timeoutMs?: number | undefined
}

export interface HttpRequest extends RequestOptions {
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'
  path: string
  query?: Record<string, string | number | undefined> | undefined
  json?: unknown
  body?: Uint8Array | ReadableStream<Uint8Array> | undefined
  contentType?: string | undefined
  accept?: string | undefined
}

export interface HttpClientOptions {
  baseUrl: string
  apiKey: string | undefined
  timeoutMs: number
  fetch: FetchLike
  userAgent?: string | undefined
}

/**
 * One abort controller per call, aborted by the caller's signal or by the timeout. `release()` stops
 * the timer (a stream's body then runs as long as it needs).
 */
class CallSignal {
  readonly controller = new AbortController()
  timedOut = false
  private timer: ReturnType<typeof setTimeout> | undefined
  private readonly onAbort = () => this.controller.abort(this.user?.reason)

  constructor(
    private readonly user: AbortSignal | undefined,
    timeoutMs: number,
  ) {
    if (user?.aborted) this.controller.abort(user.reason)
    else user?.addEventListener('abort', this.onAbort, { once: true })
    if (timeoutMs > 0 && Number.isFinite(timeoutMs)) {
      this.timer = setTimeout(() => {
        this.timedOut = true
        this.controller.abort()
      }, timeoutMs)
    }
  }

  release(): void {
    if (this.timer !== undefined) clearTimeout(this.timer)
    this.timer = undefined
  }

  dispose(): void {
    this.release()
    this.user?.removeEventListener('abort', this.onAbort)
  }

  /** Turns whatever fetch threw into the SDK's error for it. */
  failure(error: unknown, what: string): Error {
    if (this.timedOut)
      return new TimeoutError({ code: 'timeout', message: `${what} timed out`, cause: error })
    if (this.user?.aborted)
      return new AbortError({ code: 'aborted', message: `${what} was aborted`, cause: error })
    const cause =
      error instanceof Error
        ? ((error.cause as { code?: string } | undefined)?.code ?? error.message)
        : String(error)
    return new ConnectionError({
      code: 'connection_error',
      message: `cannot reach the server (${cause}): ${what}`,
      retryable: true,
      cause: error,
    })
  }
}

export class HttpClient {
  constructor(readonly options: HttpClientOptions) {}

  get baseUrl(): string {
    return this.options.baseUrl
  }

  url(path: string, query?: HttpRequest['query']): string {
    const url = new URL(this.options.baseUrl.replace(/\/+$/, '') + path)
    for (const [key, value] of Object.entries(query ?? {})) {
      if (value !== undefined) url.searchParams.set(key, String(value))
    }
    return url.toString()
  }

  /** Sends a request and reads a JSON answer; non-2xx answers throw the typed error. */
  async json(request: HttpRequest): Promise<unknown> {
    const call = new CallSignal(request.signal, request.timeoutMs ?? this.options.timeoutMs)
    try {
      const response = await this.send(request, call)
      const text = await response.text().catch((error: unknown) => {
        throw call.failure(error, `${request.method} ${request.path}`)
      })
      if (!response.ok) throw this.errorOf(response, text)
      try {
        return text === '' ? undefined : JSON.parse(text)
      } catch (error) {
        throw new InvalidResponseError({
          code: 'invalid_response',
          message: `${request.method} ${request.path}: the server answered with invalid JSON`,
          status: response.status,
          cause: error,
        })
      }
    } finally {
      call.dispose()
    }
  }

  /**
   * Sends a request whose answer is a stream. Errors before the stream starts throw; afterwards the
   * caller reads `response.body` and calls `done()` when finished.
   */
  async stream(
    request: HttpRequest,
  ): Promise<{ response: FetchResponse; abort: () => void; done: () => void }> {
    const call = new CallSignal(request.signal, request.timeoutMs ?? this.options.timeoutMs)
    try {
      const response = await this.send(request, call)
      if (!response.ok) {
        const text = await response.text().catch(() => '')
        throw this.errorOf(response, text)
      }
      call.release()
      return { response, abort: () => call.controller.abort(), done: () => call.dispose() }
    } catch (error) {
      call.dispose()
      throw error
    }
  }

  private async send(request: HttpRequest, call: CallSignal): Promise<FetchResponse> {
    const headers: Record<string, string> = { accept: request.accept ?? 'application/json' }
    if (this.options.apiKey) headers.authorization = `Bearer ${this.options.apiKey}`
    if (this.options.userAgent) headers['user-agent'] = this.options.userAgent
    const init: RequestInit & { duplex?: 'half' } = {
      method: request.method,
      headers,
      signal: call.controller.signal,
    }
    if (request.json !== undefined) {
      headers['content-type'] = 'application/json'
      init.body = JSON.stringify(request.json)
    } else if (request.body !== undefined) {
      headers['content-type'] = request.contentType ?? 'application/octet-stream'
      init.body = request.body
      // Streaming request bodies need half-duplex in fetch implementations that support them.
      if (!(request.body instanceof Uint8Array)) init.duplex = 'half'
    }
    try {
      return await this.options.fetch(this.url(request.path, request.query), init)
    } catch (error) {
      throw call.failure(error, `${request.method} ${this.url(request.path)}`)
    }
  }

  private errorOf(response: FetchResponse, text: string): Error {
    let body: unknown
    try {
      body = JSON.parse(text)
    } catch {
      body = undefined
    }
    return errorFromBody(response.status, body, response.headers.get('x-request-id') ?? undefined)
  }
}
