import http from 'node:http'
import { ERROR_CODES, isErrorCode } from '@cairn/protocol'
import { COMPAT, type FuzzRequest } from './fuzz-request-ops.js'
import type { OpenApiConformance } from './openapi-conformance.js'

// How test/security/fuzz-requests.test.ts sends its requests and judges each answer: a typed
// error (in the compat API's shape under its prefix) or a success, never a 500, never an
// unauthenticated success, and a 405 with the document's methods where the document has the path.

const REQUEST_TIMEOUT_MS = 30_000

/** 5xx codes the registry marks retryable that a genuine runtime hiccup may produce (none seen so far). */
const TOLERATED_5XX = new Set<string>([])

/** Bodies this large are sent on a connection of their own. */
export const BIG_BODY_BYTES = 1024 * 1024

export interface Answer {
  status: number
  type: string
  body: Buffer
  headers: Record<string, string | undefined>
}

/** Sends the run's requests to the server over a pool of kept-alive connections. */
export class FuzzClient {
  /** Requests that met a kept-alive socket the server had just closed, and were sent again. */
  staleSocketRetries = 0
  private readonly agent: http.Agent

  constructor(
    private readonly base: URL,
    concurrency: number,
  ) {
    this.agent = new http.Agent({ keepAlive: true, maxSockets: concurrency })
  }

  send(request: FuzzRequest, fresh = false): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const headerBytes = Object.values(request.headers).reduce((sum, value) => sum + value.length, 0)
      const big = fresh || (request.body?.length ?? 0) > BIG_BODY_BYTES || headerBytes > 8000
      const req = http.request(
        {
          host: this.base.hostname,
          port: this.base.port,
          method: request.method,
          path: request.path,
          // Node's client frames a GET or DELETE body without a length unless told: always tell it.
          headers:
            request.body === undefined
              ? request.headers
              : { ...request.headers, 'content-length': String(request.body.length) },
          // A server may answer a too-large body before reading it and close: keep that off the pool.
          agent: big ? false : this.agent,
        },
        (res) => {
          const chunks: Buffer[] = []
          res.on('data', (chunk: Buffer) => chunks.push(chunk))
          res.on('end', () =>
            resolve({
              status: res.statusCode ?? 0,
              type: String(res.headers['content-type'] ?? ''),
              body: Buffer.concat(chunks),
              headers: {
                allow: res.headers.allow,
                'cairn-session-id': res.headers['cairn-session-id'] as string | undefined,
                'cairn-turn-id': res.headers['cairn-turn-id'] as string | undefined,
              },
            }),
          )
          res.on('error', reject)
        },
      )
      req.setTimeout(REQUEST_TIMEOUT_MS, () =>
        req.destroy(new Error(`no answer within ${REQUEST_TIMEOUT_MS} ms`)),
      )
      req.on('error', (error: NodeJS.ErrnoException) => {
        // The keep-alive race every HTTP client meets (Node's docs on `reusedSocket`): a pooled
        // socket the server closed as the request went out. Sent again once, on a new connection.
        if (req.reusedSocket && (error.code === 'ECONNRESET' || error.code === 'EPIPE')) {
          this.staleSocketRetries++
          this.send(request, true).then(resolve, reject)
          return
        }
        reject(error)
      })
      req.end(request.body)
    })
  }

  close(): void {
    this.agent.destroy()
  }
}

export interface Finding {
  index: number
  what: string
  request: string
  answer: string
}

export function judge(request: FuzzRequest, status: number, type: string, body: Buffer): string | undefined {
  const text = body.toString('utf8')
  if (!request.authenticated && request.api && status < 300 && !request.path.includes('openapi.json'))
    return 'an unauthenticated request succeeded'
  if (status >= 500) {
    let code = ''
    try {
      code = String((JSON.parse(text) as { error?: { code?: unknown } }).error?.code)
    } catch {}
    if (!TOLERATED_5XX.has(code)) return `status ${status}`
  }
  if (status >= 400 && request.method !== 'HEAD' && !request.path.startsWith('/assets/')) {
    let parsed: {
      error?: { code?: unknown; message?: unknown; requestId?: unknown }
      code?: unknown
      message?: unknown
      request_id?: unknown
    }
    try {
      parsed = JSON.parse(text)
    } catch {
      return `non-JSON error body (${type})`
    }
    // The compat API answers errors in the hosted product's shape, with the registry's code; what
    // the HTTP parser refuses before any route (408, 431) is in the registry's shape everywhere.
    const compatShaped = request.path.startsWith(`${COMPAT}/`) && status !== 408 && status !== 431
    const error = compatShaped
      ? { code: parsed.code, message: parsed.message, requestId: parsed.request_id }
      : parsed.error
    if (!error || !isErrorCode(error.code)) return 'error body without a registry code'
    if (typeof error.message !== 'string' || error.message === '') return 'error body without a message'
    if (typeof error.requestId !== 'string' || !error.requestId.startsWith('req_'))
      return 'error body without a requestId'
    if (ERROR_CODES[error.code].status !== status) return `code ${error.code} sent with status ${status}`
  }
  return undefined
}

/**
 * The answer to a method the document has no operation for at `pathname`: where the document has
 * the path, 405 with Allow naming its methods (HEAD beside GET), never the router's 404; anywhere
 * else an error. Undefined: as it should be.
 */
export function unlistedAnswer(
  conformance: OpenApiConformance,
  method: string,
  pathname: string,
  res: Answer,
): string | undefined {
  const documented = conformance.methodsAt(pathname)
  const where = `conformance: ${method} ${pathname}`
  if (res.status === 405) {
    const expected = [...new Set([...documented, ...(documented.includes('GET') ? ['HEAD'] : [])])].sort()
    return res.headers.allow === expected.join(', ')
      ? undefined
      : `${where} answered 405 with Allow "${res.headers.allow}", the document lists ${expected.join(', ')}`
  }
  if (res.status < 400 || res.status >= 500) return `${where} is in no operation, answered ${res.status}`
  let message = ''
  try {
    const parsed = JSON.parse(res.body.toString('utf8'))
    message = String(parsed.error?.message ?? parsed.message)
  } catch {}
  if (documented.length > 0 && res.status === 404 && message.startsWith('no route for'))
    return `${where}: 404 no route, for a path the document has with ${documented.join(', ')} (405 expected)`
  return undefined
}
