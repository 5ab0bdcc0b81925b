import http, { type IncomingMessage, type ServerResponse } from 'node:http'
import type { Duplex } from 'node:stream'
import { CairnProblem } from '@cairn/protocol'
import type { Logger } from 'pino'
import { toErrorBody } from '../http/errors.js'
import { previewResponseHeaders, upstreamHeaders } from './preview-headers.js'
import { previewOfHost } from './preview-origins.js'
import {
  type PreviewService,
  type PreviewTarget,
  targetOnPreviewHost,
  upstreamPath,
} from './preview-service.js'

/** Largest response head an Upgrade handshake may send before the relay gives up on it. */
const MAX_HANDSHAKE_BYTES = 64 * 1024

export interface PreviewListener {
  server: http.Server
  close(): Promise<void>
}

/**
 * The preview listener: its own port, nothing but previews, one origin per session port (the Host
 * `<port>-ses-<id>.<domain>` names it). The API and console listener serves no preview content, so
 * a preview's scripts never run on the origin that holds the console's API key.
 */
export function createPreviewListener(
  previews: PreviewService,
  domain: string,
  logger: Logger,
): PreviewListener {
  const server = http.createServer((request, response) => {
    void relayRequest(previews, domain, request, response).catch((error: unknown) => {
      answerError(response, error)
      if (!(error instanceof CairnProblem)) logger.error({ err: error }, 'preview request failed')
    })
  })
  // Upgraded connections are the relay's own: the server's close would otherwise wait for them.
  const upgraded = new Set<Duplex>()
  server.on('upgrade', (request: IncomingMessage, client: Duplex, head: Buffer) => {
    upgraded.add(client)
    client.once('close', () => upgraded.delete(client))
    void relayUpgrade(previews, domain, request, client, head)
  })
  server.on('clientError', (_error, socket) => socket.destroy())
  return {
    server,
    async close() {
      for (const client of upgraded) client.destroy()
      await new Promise<void>((resolve) => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
    },
  }
}

function targetOf(domain: string, request: IncomingMessage): PreviewTarget {
  const preview = previewOfHost(request.headers.host, domain)
  if (!preview) {
    throw new CairnProblem(
      'not_found',
      `this listener serves previews only, at <port>-ses-<id>.${domain}; ask the API for a preview URL (POST /v1/sessions/{id}/ports/{port}/url)`,
    )
  }
  return targetOnPreviewHost(preview, request.url)
}

async function relayRequest(
  previews: PreviewService,
  domain: string,
  request: IncomingMessage,
  response: ServerResponse,
): Promise<void> {
  const target = targetOf(domain, request)
  const { row, cookie } = await previews.authorize(target, request.headers, request.method)
  const socket = await previews.connect(row, target.port)
  const upstream = http.request({
    method: request.method,
    path: upstreamPath(target),
    headers: upstreamHeaders(request.headers, target.port, false),
    createConnection: () => socket,
  })
  // The relay hands the socket over paused (nothing may be lost before a reader is there).
  upstream.once('socket', (s) => s.resume())
  upstream.on('response', (answer: IncomingMessage) => {
    response.writeHead(
      answer.statusCode ?? 502,
      answer.statusMessage,
      previewResponseHeaders(answer.headers, cookie),
    )
    answer.pipe(response)
    answer.on('data', () => previews.noteActivity(row))
  })
  upstream.on('error', (error) => {
    if (!response.headersSent) {
      answerError(
        response,
        new CairnProblem('port_unreachable', `the service on port ${target.port} failed: ${error.message}`),
      )
    } else response.destroy()
  })
  response.on('close', () => {
    if (!response.writableFinished) upstream.destroy()
  })
  request.pipe(upstream)
}

function answerError(response: ServerResponse, error: unknown): void {
  if (response.headersSent) {
    response.destroy()
    return
  }
  const { status, body } = toErrorBody(error, requestId())
  response.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body))
}

const requestId = () => `req_${Math.random().toString(36).slice(2, 12)}`

// WebSocket (and any other Upgrade): the handshake, its answer with the same header rules as any
// preview response, then raw bytes both ways.
async function relayUpgrade(
  previews: PreviewService,
  domain: string,
  request: IncomingMessage,
  client: Duplex,
  head: Buffer,
): Promise<void> {
  client.on('error', () => client.destroy())
  try {
    const target = targetOf(domain, request)
    // The cookie a signed URL leaves is for pages; a WebSocket URL carries its signature itself.
    const authorized = await previews.authorize(target, request.headers, request.method)
    const { row } = authorized
    // The epoch the connection was authorized at: a revocation past it closes the connection.
    const epoch = authorized.epoch ?? (await previews.relayEpoch(row.id, target.port))
    const upstream = await previews.connect(row, target.port)
    previews.trackRelayed(row.id, target.port, client, epoch)
    // A revocation (and its hint) between the authorization and the tracking found nothing to close.
    if ((await previews.relayEpoch(row.id, target.port)) > epoch) {
      upstream.destroy()
      client.destroy()
      return
    }
    const lines = [`${request.method} ${upstreamPath(target)} HTTP/1.1`]
    for (const [name, value] of Object.entries(upstreamHeaders(request.headers, target.port, true))) {
      for (const v of Array.isArray(value) ? value : [value]) lines.push(`${name}: ${v}`)
    }
    upstream.write(`${lines.join('\r\n')}\r\n\r\n`)
    if (head.length > 0) upstream.write(head)
    upstream.on('error', () => client.destroy())
    client.on('close', () => upstream.destroy())
    upstream.on('close', () => client.destroy())
    upstream.on('data', () => previews.noteActivity(row))
    client.on('data', () => previews.noteActivity(row))
    client.pipe(upstream)
    // The answer's head is rewritten like any preview response's; what follows it is relayed as is.
    let answer = Buffer.alloc(0)
    const onHead = (chunk: Buffer) => {
      answer = Buffer.concat([answer, chunk])
      const end = answer.indexOf('\r\n\r\n')
      if (end < 0) {
        if (answer.length > MAX_HANDSHAKE_BYTES) upstream.destroy()
        return
      }
      upstream.off('data', onHead)
      client.write(rewriteResponseHead(answer.subarray(0, end).toString('latin1')))
      const rest = answer.subarray(end + 4)
      if (rest.length > 0) client.write(rest)
      upstream.pipe(client)
    }
    upstream.on('data', onHead)
    // The relay hands the socket over paused; a 'data' listener alone does not resume it.
    upstream.resume()
  } catch (error) {
    const { status, body } = toErrorBody(error, requestId())
    const text = JSON.stringify(body)
    client.end(
      `HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ''}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
    )
  }
}

/** A raw response head (status line and headers, no blank line) with the preview header rules applied. */
function rewriteResponseHead(head: string): Buffer {
  const [statusLine = '', ...lines] = head.split('\r\n')
  const headers: Record<string, string[]> = {}
  for (const line of lines) {
    const colon = line.indexOf(':')
    if (colon <= 0) continue
    const name = line.slice(0, colon).trim().toLowerCase()
    headers[name] = [...(headers[name] ?? []), line.slice(colon + 1).trim()]
  }
  const single = Object.fromEntries(
    Object.entries(headers).map(([name, values]) => [
      name,
      name === 'set-cookie' ? values : values.join(', '),
    ]),
  )
  const out = [statusLine]
  for (const [name, value] of Object.entries(previewResponseHeaders(single, undefined, { upgrade: true }))) {
    for (const v of Array.isArray(value) ? value : [value]) out.push(`${name}: ${v}`)
  }
  return Buffer.from(`${out.join('\r\n')}\r\n\r\n`, 'latin1')
}
