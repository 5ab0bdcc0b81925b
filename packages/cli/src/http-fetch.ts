import http from 'node:http'
import type https from 'node:https'
import { createRequire } from 'node:module'
import { Readable } from 'node:stream'
import type { FetchResponse } from '@cairn/sdk'

/**
 * node:https, loaded for an https URL only: it loads TLS and crypto, which a request to a local
 * server (the usual `cairn sessions list`) never needs (~2.5 ms of every command's start). Not an
 * `import()`: the bundle runs in `vm.Script`, which cannot import on Node 20. Before Node 20.16
 * (no `process.getBuiltinModule`) a require from anywhere: built-ins resolve from any path.
 */
function httpsModule(): typeof https {
  return process.getBuiltinModule?.('node:https') ?? createRequire(`${process.cwd()}/`)('node:https')
}

/** Statuses whose answer has no body. */
const NULL_BODY_STATUSES = new Set([101, 103, 204, 205, 304])

/**
 * The CLI's `fetch`, over node:http. Node's own fetch (undici) parses HTTP in WebAssembly and
 * builds WHATWG objects whose loading costs a one-request command more than its request (a
 * `sessions list` 120 ms where the same request over node:http takes 58 ms; bench/cli.ts). The
 * answer has what the SDK reads of one (`FetchResponse`): status, headers, the body as a web
 * stream (SSE included) and as text.
 */
export function httpFetch(input: string, init: RequestInit = {}): Promise<FetchResponse> {
  const url = new URL(input)
  const transport = url.protocol === 'https:' ? httpsModule() : url.protocol === 'http:' ? http : undefined
  if (!transport) return Promise.reject(new TypeError(`unsupported URL scheme: ${url.protocol}`))
  const signal = init.signal ?? undefined
  return new Promise<FetchResponse>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    const request = transport.request(url, {
      method: init.method ?? 'GET',
      headers: plainHeaders(init.headers),
      ...(signal ? { signal } : {}),
    })
    request.once('error', (error) => reject(signal?.aborted ? signal.reason : error))
    request.once('response', (answer) => {
      const status = answer.statusCode ?? 0
      if (NULL_BODY_STATUSES.has(status)) answer.resume()
      const empty = NULL_BODY_STATUSES.has(status)
      // The web stream is made when the body is read as one (SSE, downloads): Node's web streams
      // are modules of their own to load, which a JSON answer, read by `text()`, does without.
      let web: ReadableStream<Uint8Array> | undefined
      const webBody = () => {
        web ??= Readable.toWeb(answer) as unknown as ReadableStream<Uint8Array>
        return web
      }
      resolve({
        ok: status >= 200 && status <= 299,
        status,
        headers: {
          get: (name) => {
            const value = answer.headers[name.toLowerCase()]
            return value === undefined ? null : Array.isArray(value) ? value.join(', ') : value
          },
        },
        get body() {
          return empty ? null : webBody()
        },
        text: () => (empty ? Promise.resolve('') : web ? textOf(web) : textOf(answer)),
      })
    })
    const body = init.body
    if (body === undefined || body === null) {
      request.end()
    } else if (typeof body === 'string' || body instanceof Uint8Array) {
      request.end(body)
    } else if (body instanceof ReadableStream) {
      Readable.fromWeb(body as import('node:stream/web').ReadableStream).pipe(request)
    } else {
      request.destroy()
      reject(new TypeError('the CLI sends string, Uint8Array or ReadableStream bodies'))
    }
  })
}

/** The SDK sends its headers as a plain record; pairs and `Headers` are read as what they iterate. */
function plainHeaders(headers: RequestInit['headers']): http.OutgoingHttpHeaders {
  if (headers === undefined) return {}
  const pairs = Symbol.iterator in headers ? (headers as Iterable<[string, string]>) : Object.entries(headers)
  return Object.fromEntries([...pairs].map(([name, value]) => [name, String(value)]))
}

async function textOf(body: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>): Promise<string> {
  const decoder = new TextDecoder()
  let text = ''
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>)
    text += decoder.decode(chunk, { stream: true })
  return text + decoder.decode()
}
