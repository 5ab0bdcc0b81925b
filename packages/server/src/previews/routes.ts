import http, { type IncomingHttpHeaders, type IncomingMessage } from 'node:http'
import type { Duplex } from 'node:stream'
import { CairnProblem, ErrorBodySchema, OkSchema } from '@cairn/protocol'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { requireWrite } from '../auth/plugin.js'
import { toErrorBody } from '../http/errors.js'
import {
  DEFAULT_PREVIEW_TTL_MS,
  type PreviewService,
  type PreviewTarget,
  parsePreviewTarget,
  previewPrefix,
  upstreamPath,
  withoutPreviewCookie,
} from './preview-service.js'

const PortParams = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 200 }),
  port: Type.Integer({ minimum: 1, maximum: 65535 }),
})
const SignedUrlBody = Type.Object(
  { ttlMs: Type.Optional(Type.Integer({ minimum: 1000, maximum: 7 * 24 * 3600 * 1000 })) },
  { additionalProperties: false },
)
const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'] as const
// Connection-level headers are the proxy's own on each side; they are not forwarded.
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
])

/** Whether the bearer-key hook must leave a request to the preview's own authorization. */
export function isPreviewRequest(request: FastifyRequest): boolean {
  const target = parsePreviewTarget(request.url)
  const ownRoute = (request.method === 'POST' || request.method === 'DELETE') && target?.rest === '/url'
  return target !== undefined && !ownRoute
}

/** What the service sees of the request: no API key, no preview cookie, its own Host. */
function upstreamHeaders(headers: IncomingHttpHeaders, target: PreviewTarget, upgrade: boolean) {
  const out: Record<string, string | string[]> = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || name === 'authorization' || name === 'cookie' || name === 'host') continue
    if (HOP_BY_HOP.has(name) && !(upgrade && (name === 'connection' || name === 'upgrade'))) continue
    out[name] = value
  }
  const cookie = withoutPreviewCookie(headers.cookie)
  if (cookie) out.cookie = cookie
  out.host = `localhost:${target.port}`
  if (headers.host) out['x-forwarded-host'] = headers.host
  out['x-forwarded-proto'] = 'http'
  out['x-forwarded-prefix'] = previewPrefix(target.sessionId, target.port)
  return out
}

export function previewRoutes(app: FastifyInstance, previews: PreviewService): void {
  // Relayed Upgrade connections per session port: a revocation closes them, as its URLs stop.
  const relayed = new Map<string, Set<Duplex>>()
  const relayedKey = (sessionId: string, port: number) => `${sessionId}:${port}`
  app.post(
    '/v1/sessions/:id/ports/:port/url',
    {
      schema: {
        tags: ['previews'],
        summary: 'A signed URL to the service on a port inside the session sandbox, valid for ttlMs',
        params: PortParams,
        body: SignedUrlBody,
        response: {
          200: Type.Object({ url: Type.String(), expiresAt: Type.String() }),
          401: ErrorBodySchema,
          404: ErrorBodySchema,
        },
      },
    },
    async (request) => {
      const { id, port } = request.params as { id: string; port: number }
      const ttlMs = (request.body as { ttlMs?: number } | undefined)?.ttlMs ?? DEFAULT_PREVIEW_TTL_MS
      const origin = `${request.protocol}://${request.headers.host ?? request.hostname}`
      return previews.signedUrl(requireWrite(request).tenantId, id, port, ttlMs, origin)
    },
  )

  app.delete(
    '/v1/sessions/:id/ports/:port/url',
    {
      schema: {
        tags: ['previews'],
        summary:
          'Revoke every signed URL issued so far for a port of the session (and the cookies they left); later ones work',
        params: PortParams,
        response: {
          200: OkSchema,
          401: ErrorBodySchema,
          403: ErrorBodySchema,
          404: ErrorBodySchema,
        },
      },
    },
    async (request) => {
      const { id, port } = request.params as { id: string; port: number }
      const sessionId = previews.revokeUrls(requireWrite(request).tenantId, id, port)
      for (const client of relayed.get(relayedKey(sessionId, port)) ?? []) client.destroy()
      return { ok: true }
    },
  )

  // An encapsulated scope whose bodies are left unread, to be streamed to the service as they come.
  void app.register(async (scope) => {
    scope.removeAllContentTypeParsers()
    scope.addContentTypeParser('*', (_request, _payload, done) => done(null, undefined))
    scope.route({
      method: [...METHODS],
      url: '/v1/sessions/:id/ports/:port',
      schema: { hide: true },
      // Relative links of the page resolve against the directory, so the prefix ends with '/'.
      handler: async (request, reply) => {
        const [path, query] = request.url.split('?', 2)
        return reply.redirect(`${path}/${query ? `?${query}` : ''}`, 308)
      },
    })
    scope.route({
      method: [...METHODS],
      url: '/v1/sessions/:id/ports/:port/*',
      schema: { hide: true },
      handler: async (request, reply) => {
        const target = parsePreviewTarget(request.url)
        if (!target) throw new CairnProblem('not_found', `no route ${request.method} ${request.url}`)
        const { row, cookie } = previews.authorize(target, request.headers)
        const socket = await previews.connect(row, target.port)
        reply.hijack()
        const res = reply.raw
        const upstream = http.request({
          method: request.method,
          path: upstreamPath(target),
          headers: upstreamHeaders(request.headers, target, false),
          createConnection: () => socket,
        })
        // The relay hands the socket over paused (nothing may be lost before a reader is there).
        upstream.once('socket', (s) => s.resume())
        upstream.on('response', (answer: IncomingMessage) => {
          const headers: Record<string, string | string[]> = {}
          for (const [name, value] of Object.entries(answer.headers)) {
            if (value !== undefined && !HOP_BY_HOP.has(name)) headers[name] = value
          }
          if (cookie) {
            const set = headers['set-cookie']
            headers['set-cookie'] = [...(Array.isArray(set) ? set : set ? [set] : []), cookie]
          }
          res.writeHead(answer.statusCode ?? 502, answer.statusMessage, headers)
          answer.pipe(res)
          answer.on('data', () => previews.noteActivity(row))
        })
        upstream.on('error', (error) => {
          if (!res.headersSent) {
            const { status, body } = toErrorBody(
              new CairnProblem(
                'port_unreachable',
                `the service on port ${target.port} failed: ${error.message}`,
              ),
              request.id,
            )
            res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body))
          } else res.destroy()
        })
        res.on('close', () => {
          if (!res.writableFinished) upstream.destroy()
        })
        request.raw.pipe(upstream)
      },
    })
  })

  // WebSocket (and any other Upgrade): the handshake and then raw bytes, both ways.
  // Upgraded connections are the relay's own: the server's close would otherwise wait for them.
  const upgraded = new Set<Duplex>()
  app.server.on('upgrade', (request: IncomingMessage, client: Duplex, head: Buffer) => {
    upgraded.add(client)
    client.once('close', () => upgraded.delete(client))
    void relayUpgrade(previews, request, client, head, (sessionId, port) => {
      if (client.destroyed) return
      const key = relayedKey(sessionId, port)
      const clients = relayed.get(key) ?? new Set<Duplex>()
      relayed.set(key, clients.add(client))
      client.once('close', () => {
        clients.delete(client)
        if (clients.size === 0 && relayed.get(key) === clients) relayed.delete(key)
      })
    })
  })
  app.addHook('preClose', async () => {
    for (const client of upgraded) client.destroy()
  })
}

async function relayUpgrade(
  previews: PreviewService,
  request: IncomingMessage,
  client: Duplex,
  head: Buffer,
  onRelayed: (sessionId: string, port: number) => void,
): Promise<void> {
  client.on('error', () => client.destroy())
  const target = parsePreviewTarget(request.url)
  try {
    if (!target) throw new CairnProblem('not_found', `no upgrade route for ${request.url}`)
    // The cookie a signed URL leaves is for pages; a WebSocket URL carries its signature itself.
    const { row } = previews.authorize(target, request.headers)
    const upstream = await previews.connect(row, target.port)
    onRelayed(row.id, target.port)
    const headers = upstreamHeaders(request.headers, target, true)
    const lines = [`${request.method} ${upstreamPath(target)} HTTP/1.1`]
    for (const [name, value] of Object.entries(headers)) {
      for (const v of Array.isArray(value) ? value : [value]) lines.push(`${name}: ${v}`)
    }
    upstream.write(`${lines.join('\r\n')}\r\n\r\n`)
    if (head.length > 0) upstream.write(head)
    upstream.on('error', () => client.destroy())
    client.on('close', () => upstream.destroy())
    upstream.on('close', () => client.destroy())
    upstream.on('data', () => previews.noteActivity(row))
    client.on('data', () => previews.noteActivity(row))
    upstream.pipe(client)
    client.pipe(upstream)
  } catch (error) {
    const { status, body } = toErrorBody(error, `req_upgrade`)
    const text = JSON.stringify(body)
    client.end(
      `HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ''}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
    )
  }
}
