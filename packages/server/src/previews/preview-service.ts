import type { IncomingHttpHeaders } from 'node:http'
import type { Duplex } from 'node:stream'
import { CairnProblem } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { ApiKeyStore } from '../auth/api-keys.js'
import { type Clock, iso } from '../clock.js'
import type { HintFeed } from '../cluster/cluster-hints.js'
import type { Db } from '../db/database.js'
import type { SessionObserver } from '../sessions/session-observer.js'
import type { SessionService } from '../sessions/session-service.js'
import type { SessionRow } from '../sessions/session-store.js'
import type { PreviewRevocations } from './preview-revocations.js'
import {
  EPOCH_PARAM,
  EXPIRES_PARAM,
  PREVIEW_COOKIE,
  type PreviewSigner,
  SIGNATURE_PARAM,
} from './preview-signer.js'

export const DEFAULT_PREVIEW_TTL_MS = 60 * 60 * 1000

/** A request to a preview: its session port (from the Host), the path inside it and the query. */
export interface PreviewTarget {
  sessionId: string
  port: number
  /** The path inside the preview, `''` when the URL stops at the port. */
  rest: string
  query: URLSearchParams
}

const PREVIEW_PATH = /^\/v1\/sessions\/(ses_[0-9a-z]+)\/ports\/(\d{1,5})(\/[^?]*)?(?:\?(.*))?$/

/**
 * `/v1/sessions/{id}/ports/{port}{rest}?{query}` on the API listener: where previews were served
 * before they moved to their own origins (the API answers these with a redirect there).
 */
export function parsePreviewTarget(url: string | undefined): PreviewTarget | undefined {
  const match = url ? PREVIEW_PATH.exec(url) : null
  if (!match?.[1] || !match[2]) return undefined
  const port = Number(match[2])
  if (port < 1 || port > 65535) return undefined
  return { sessionId: match[1], port, rest: match[3] ?? '', query: new URLSearchParams(match[4] ?? '') }
}

/** The path and query sent to the service: the prefix and Cairn's own parameters removed. */
export function upstreamPath(target: PreviewTarget): string {
  const query = new URLSearchParams(target.query)
  query.delete(SIGNATURE_PARAM)
  query.delete(EXPIRES_PARAM)
  query.delete(EPOCH_PARAM)
  const search = query.toString()
  return `${target.rest || '/'}${search ? `?${search}` : ''}`
}

/** The request on the preview listener, for the session port its Host names. */
export function targetOnPreviewHost(
  preview: { sessionId: string; port: number },
  url: string | undefined,
): PreviewTarget {
  const [path = '/', query = ''] = (url ?? '/').split(/\?(.*)/s, 2)
  return { ...preview, rest: path, query: new URLSearchParams(query) }
}

export interface PreviewServiceDeps {
  db: Db
  keys: ApiKeyStore
  sessions: SessionService
  signer: PreviewSigner
  revocations: PreviewRevocations
  /** Connections into sandboxes, through the runtime's port. */
  runtime: Pick<RuntimePort, 'connectPort' | 'listeningPorts'>
  clock: Clock
  logger: Logger
  /** With replicas: revocations made by any of them close the connections this one relays. */
  hints?: HintFeed | undefined
}

export interface AuthorizedPreview {
  row: SessionRow
  /** The URL epoch a signed URL (or its cookie) was verified at; none for an API key. */
  epoch?: number
  /** A `Set-Cookie` value carrying a URL's signature, so the page's own links keep working. */
  cookie?: string | undefined
}

/**
 * Previews: a service on a port inside a session's sandbox, reached with the caller's API key or a
 * signed URL. Every request counts as session activity.
 */
export class PreviewService implements SessionObserver {
  // Relayed Upgrade connections, each with its session port and that port's URL epoch when it
  // was relayed: a revocation closes them, as its URLs stop.
  private readonly relayed = new Map<Duplex, { sessionId: string; port: number; epoch: number }>()

  constructor(private readonly deps: PreviewServiceDeps) {
    void deps.hints?.subscribe((hint) => {
      if (hint.kind === 'preview.revoke') this.closeRelayed(hint.sessionId, hint.port)
    })
    // Hints may have been missed: every relayed connection is checked against the database.
    deps.hints?.onResumed(() => {
      void this.closeRevokedRelays().catch((error: unknown) =>
        deps.logger.warn({ err: error }, 'checking relayed preview connections failed'),
      )
    })
  }

  /**
   * A session ended or deleted (the service is one of the session service's observers): an ended
   * session's URLs stay dead when it is resumed (whoever resumes it hands out new ones); a deleted
   * one's answer `revoked` like any other.
   */
  async ended(sessionId: string): Promise<void> {
    // Before the end is answered: a URL fetched right after must already be dead.
    // The hint in the same transaction (NOTIFY is sent on commit).
    await this.deps.db
      .transaction(async () => {
        await this.deps.revocations.revokeSession(sessionId)
        await this.deps.hints?.publish({ kind: 'preview.revoke', sessionId })
      })
      .then(() => this.closeRelayed(sessionId, undefined))
      .catch((error: unknown) =>
        this.deps.logger.error({ err: error, session: sessionId }, 'revoking preview URLs failed'),
      )
  }

  async signedUrl(
    tenantId: string,
    sessionId: string,
    port: number,
    ttlMs: number,
    /** The origin of the session port's previews, given the session's full id. */
    originOf: (sessionId: string) => string,
  ): Promise<{ url: string; expiresAt: string }> {
    const row = await this.deps.sessions.requireLive(tenantId, sessionId)
    await this.requireListening(row, port)
    const expiresAtMs = this.deps.clock.now() + ttlMs
    const epoch = await this.deps.revocations.current(row.id, port)
    const signature = this.deps.signer.sign({ sessionId: row.id, port, expiresAtMs, epoch })
    const query = new URLSearchParams({
      [EXPIRES_PARAM]: String(expiresAtMs),
      ...(epoch > 0 ? { [EPOCH_PARAM]: String(epoch) } : {}),
      [SIGNATURE_PARAM]: signature,
    })
    return { url: `${originOf(row.id)}/?${query}`, expiresAt: iso(expiresAtMs) }
  }

  /**
   * Refuses a URL to a running sandbox that could only fail: the port is among those listening,
   * or a connection to it says why not (a driver that cannot reach ports: gVisor; nothing
   * listening); a service that began listening meanwhile is let through. Without a running
   * sandbox the URL is issued (it works once a message starts one and the service listens).
   */
  private async requireListening(row: SessionRow, port: number): Promise<void> {
    if (!(await this.deps.sessions.warmAgent(row.id))) return
    const listening = await this.deps.runtime.listeningPorts(row.id)
    if (listening.includes(port)) return
    const socket = await this.deps.runtime.connectPort(row.id, port).catch((error: unknown) => {
      if (!(error instanceof CairnProblem) || error.code !== 'port_unreachable') throw error
      const others = listening.length > 0 ? ` (listening: ${listening.join(', ')})` : ''
      throw new CairnProblem(
        'port_not_listening',
        `nothing listens on port ${port} in the sandbox of session ${row.id}${others}; start the service, then ask for its URL`,
        { port, listening },
      )
    })
    socket.destroy()
  }

  /**
   * Revokes every signed URL issued so far for the port (and the cookies they left), and closes the
   * Upgrade (WebSocket) connections relayed to it.
   */
  async revokeUrls(tenantId: string, sessionId: string, port: number): Promise<void> {
    const row = await this.deps.sessions.requireOwned(tenantId, sessionId)
    await this.deps.db.transaction(async () => {
      await this.deps.revocations.revokePort(row.id, port)
      await this.deps.hints?.publish({ kind: 'preview.revoke', sessionId: row.id, port })
    })
    this.closeRelayed(row.id, port)
  }

  /**
   * Remembers a relayed Upgrade connection until it closes, so a revocation can close it (one made
   * since `epoch`, the port's URL epoch when the connection was authorized, included).
   */
  trackRelayed(sessionId: string, port: number, client: Duplex, epoch: number): void {
    if (client.destroyed) return
    this.relayed.set(client, { sessionId, port, epoch })
    client.once('close', () => this.relayed.delete(client))
  }

  /** The port's URL epoch now, to relay a connection under. */
  relayEpoch(sessionId: string, port: number): Promise<number> {
    return this.deps.revocations.current(sessionId, port)
  }

  /** Closes the connections relayed to the session's port (without a port: to any of its ports). */
  private closeRelayed(sessionId: string, port: number | undefined): void {
    for (const [client, to] of this.relayed)
      if (to.sessionId === sessionId && (port === undefined || to.port === port)) client.destroy()
  }

  /** Closes every relayed connection whose port's URLs were revoked since it was relayed. */
  private async closeRevokedRelays(): Promise<void> {
    for (const [client, to] of [...this.relayed])
      if ((await this.deps.revocations.current(to.sessionId, to.port)) > to.epoch) client.destroy()
  }

  private async verifySigned(
    target: PreviewTarget,
    expiresAtMs: number,
    epoch: number,
    signature: string,
  ): Promise<void> {
    const { sessionId, port } = target
    this.deps.signer.verify(
      { sessionId, port, expiresAtMs, epoch },
      signature,
      await this.deps.revocations.current(sessionId, port),
      this.deps.clock.now(),
    )
  }

  /**
   * Who may reach the preview: a signed URL (query), the cookie a signed URL left, or an API key
   * with write access to the session's tenant. 401 without any, 403 for a bad or expired one.
   */
  async authorize(
    target: PreviewTarget,
    headers: IncomingHttpHeaders,
    method = 'GET',
  ): Promise<AuthorizedPreview> {
    const now = this.deps.clock.now()
    const signature = target.query.get(SIGNATURE_PARAM)
    const expires = target.query.get(EXPIRES_PARAM)
    if (signature !== null || expires !== null) {
      const expiresAtMs = Number(expires)
      const epoch = Number(target.query.get(EPOCH_PARAM) ?? 0)
      await this.verifySigned(target, expiresAtMs, epoch, signature ?? '')
      const maxAge = Math.max(1, Math.floor((expiresAtMs - now) / 1000))
      return {
        row: await this.signedRow(target),
        cookie: `${PREVIEW_COOKIE}=${expiresAtMs}.${epoch}.${signature}; Path=/; Max-Age=${maxAge}; HttpOnly; SameSite=Lax`,
        epoch,
      }
    }
    const cookie = previewCookie(headers.cookie)
    if (cookie) {
      refuseForeignCookieUse(headers, method)
      // `expires.epoch.signature`; cookies set before revocation existed have no epoch (0).
      const parts = cookie.split('.')
      const [expiresAtMs, epoch, sig] = parts.length === 2 ? [parts[0], '0', parts[1]] : parts
      await this.verifySigned(target, Number(expiresAtMs), Number(epoch), sig ?? '')
      return { row: await this.signedRow(target), epoch: Number(epoch) }
    }
    const match = headers.authorization ? /^Bearer\s+(\S+)$/i.exec(headers.authorization) : null
    if (!match?.[1]) {
      throw new CairnProblem(
        'unauthorized',
        'a preview needs an API key (Authorization: Bearer <key>) or a signed URL (POST …/ports/{port}/url)',
      )
    }
    const principal = await this.deps.keys.verify(match[1])
    if (!principal) throw new CairnProblem('unauthorized', 'invalid API key')
    if (principal.role === 'read') throw new CairnProblem('forbidden', 'this API key is read-only')
    return { row: await this.deps.sessions.requireOwned(principal.tenantId, target.sessionId) }
  }

  private async signedRow(target: PreviewTarget): Promise<SessionRow> {
    const tenant = (
      await this.deps.db.q
        .selectFrom('sessions')
        .select('tenant_id')
        .where('id', '=', target.sessionId)
        .executeTakeFirst()
    )?.tenant_id
    const row = tenant ? await this.deps.sessions.store.get(tenant, target.sessionId) : undefined
    if (!row) throw new CairnProblem('session_not_found', `No session found matching '${target.sessionId}'`)
    return row
  }

  /** A connection to the port inside the session's running sandbox; counts as activity. */
  async connect(row: SessionRow, port: number): Promise<Duplex> {
    if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${row.id} was deleted`)
    const agent = await this.deps.sessions.warmAgent(row.id)
    if (!agent) {
      throw new CairnProblem(
        'sandbox_not_running',
        `session ${row.id} has no running sandbox; send it a message to start one`,
      )
    }
    this.deps.sessions.noteActivity(row)
    return this.deps.runtime.connectPort(row.id, port)
  }

  noteActivity(row: SessionRow): void {
    this.deps.sessions.noteActivity(row)
  }
}

/**
 * The preview cookie stands for the user only on the preview's own pages: a request that another
 * origin made the browser send (`Sec-Fetch-Site` same-site or cross-site: a sibling preview under
 * the same preview domain, any site) may not ride on it, except a plain navigation (GET or HEAD:
 * a link, a bookmark). Browsers that send no fetch metadata are let through.
 */
function refuseForeignCookieUse(headers: IncomingHttpHeaders, method: string): void {
  const site = headers['sec-fetch-site']
  if (site === undefined || site === 'same-origin' || site === 'none') return
  const navigation = headers['sec-fetch-mode'] === 'navigate' && (method === 'GET' || method === 'HEAD')
  if (navigation) return
  throw new CairnProblem(
    'forbidden',
    `the preview cookie is not accepted on a request another origin made (Sec-Fetch-Site: ${site}); use a signed URL`,
    { reason: 'foreign_request' },
  )
}

function previewCookie(header: string | undefined): string | undefined {
  for (const part of header?.split(';') ?? []) {
    const [name, ...value] = part.trim().split('=')
    if (name === PREVIEW_COOKIE) return value.join('=')
  }
  return undefined
}
