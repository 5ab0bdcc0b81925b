import { readFileSync } from 'node:fs'
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import { isIPv6, type Socket } from 'node:net'
import { ERROR_CODES, type ErrorCode } from '@cairn/protocol'
import { errorBody } from './errors.js'

/** What every listener of the server (the API's, the previews') admits; see docs/security.md. */
export interface ListenerLimits {
  /** Connections all listeners together may hold (clamped below the descriptor limit). */
  maxConnections: number
  /** Connections one peer may hold (an IPv4 address, or an IPv6 /64). */
  maxConnectionsPerPeer: number
  /** A connection's request headers (its first request's from the connection's start) must be in by then. */
  headersTimeoutMs: number
  /** A keep-alive connection with no request in flight is closed after this long. */
  idleTimeoutMs: number
  /**
   * A request, its body included, must be in by then (at least `headersTimeoutMs`); past it the
   * connection is answered `408 request_timeout` and closed (Fastify's default turned Node's off).
   */
  requestTimeoutMs: number
}

/**
 * Open descriptors this process may hold: RLIMIT_NOFILE's soft limit (Node raises it to the hard
 * limit as it starts). Undefined where `/proc` does not say.
 */
export function descriptorLimit(limitsFile = '/proc/self/limits'): number | undefined {
  try {
    const line = readFileSync(limitsFile, 'utf8')
      .split('\n')
      .find((l) => l.startsWith('Max open files'))
    const soft = line?.slice('Max open files'.length).trim().split(/\s+/)[0]
    const value = Number(soft)
    return soft === 'unlimited' ? 1 << 20 : Number.isInteger(value) ? value : undefined
  } catch {
    return undefined
  }
}

/**
 * Descriptors the listeners never take: the runtime's (sandboxes' pipes and cgroups, egress
 * tunnels, the database, files), a quarter of the limit and at least 256.
 */
export function descriptorReserve(limit: number): number {
  return Math.max(256, Math.floor(limit / 4))
}

/** The most connections listeners may hold under `limit` descriptors (unknown: 10,000): what the reserve leaves. */
export function connectionCeiling(limit: number | undefined): number {
  if (limit === undefined) return 10_000
  return Math.max(1, limit - descriptorReserve(limit))
}

/** A peer as admission counts it: an IPv4 address (also when IPv4-mapped), or an IPv6 address's /64. */
export function peerKey(address: string | undefined): string {
  if (!address) return 'unknown'
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)
  if (mapped?.[1]) return mapped[1]
  if (!isIPv6(address)) return address
  const [head = '', tail = ''] = address.toLowerCase().split('::')
  const left = head ? head.split(':') : []
  const right = tail ? tail.split(':') : []
  const groups = address.includes('::')
    ? [...left, ...Array<string>(8 - left.length - right.length).fill('0'), ...right]
    : left
  return `${groups
    .slice(0, 4)
    .map((g) => Number.parseInt(g, 16).toString(16))
    .join(':')}::/64`
}

/**
 * Admission of connections on every listener: a cap per peer and one in total (below the
 * descriptor limit, so the runtime keeps its reserve), connections refused over either with a
 * typed answer and closed; a connection that has not sent its first request's headers within
 * `headersTimeoutMs` is closed (Node's own header timeout starts only at the first byte).
 */
export class ConnectionAdmission {
  readonly maxConnections: number
  readonly maxConnectionsPerPeer: number
  private total = 0
  private readonly peers = new Map<string, number>()
  /** Connections still waiting for their first request, with the timer that closes them. */
  private readonly waiting = new Map<Socket, NodeJS.Timeout>()

  constructor(
    private readonly limits: ListenerLimits,
    descriptors: number | undefined = descriptorLimit(),
  ) {
    this.maxConnections = Math.min(limits.maxConnections, connectionCeiling(descriptors))
    this.maxConnectionsPerPeer = Math.min(limits.maxConnectionsPerPeer, this.maxConnections)
  }

  /** Connections the listeners hold now. */
  get open(): number {
    return this.total
  }

  /**
   * Puts `server` under this admission and its timeouts (before it listens). `relaysUpgrades`: the
   * server answers Upgrade requests itself (the preview listener), so an upgraded connection counts
   * as started like a request.
   */
  attach(server: Server, options: { relaysUpgrades: boolean }): void {
    server.headersTimeout = this.limits.headersTimeoutMs
    server.keepAliveTimeout = this.limits.idleTimeoutMs
    // A body sent a byte now and then held its connection (and what it declared of the body
    // budget) for as long as it lasted: Fastify gives Node 0, no bound, for the whole request.
    server.requestTimeout = Math.max(this.limits.requestTimeoutMs, this.limits.headersTimeoutMs)
    // How often Node looks for connections past their header timeout (30 s by default).
    ;(server as Server & { connectionsCheckingInterval: number }).connectionsCheckingInterval = Math.max(
      100,
      Math.min(1000, this.limits.headersTimeoutMs / 4),
    )
    // Node answers these itself, bare (no body, no code): an HTTP/1.1 request without Host (400;
    // the API answers it, a preview listener finds no preview in it) and an Expect other than
    // 100-continue (417): both are answered in the registry's shape instead.
    ;(server as Server & { requireHostHeader: boolean }).requireHostHeader = false
    server.on('checkExpectation', (request: IncomingMessage, response: ServerResponse) =>
      answerUnmetExpectation(request, response),
    )
    server.on('connection', (socket: Socket) => this.admit(socket))
    const started = (request: IncomingMessage) => this.started(request.socket)
    server.on('request', started)
    // Only where the server relays upgrades itself: any 'upgrade' listener makes Node hand it every
    // Upgrade request, so on the API listener one was left unanswered and held open, and the
    // server's close waited for it.
    if (options.relaysUpgrades) server.on('upgrade', started)
  }

  private admit(socket: Socket): void {
    const peer = peerKey(socket.remoteAddress)
    const fromPeer = this.peers.get(peer) ?? 0
    const refusal =
      this.total >= this.maxConnections
        ? (['unavailable', `the server holds its most connections (${this.maxConnections}); retry`] as const)
        : fromPeer >= this.maxConnectionsPerPeer
          ? ([
              'rate_limited',
              `this address holds the most connections one peer may (${this.maxConnectionsPerPeer}); close some or retry`,
            ] as const)
          : undefined
    if (refusal) {
      refuse(socket, refusal[0], refusal[1])
      return
    }
    this.total++
    this.peers.set(peer, fromPeer + 1)
    const timer = setTimeout(() => socket.destroy(), this.limits.headersTimeoutMs)
    timer.unref()
    this.waiting.set(socket, timer)
    socket.once('close', () => {
      this.started(socket)
      this.total--
      const left = (this.peers.get(peer) ?? 1) - 1
      if (left > 0) this.peers.set(peer, left)
      else this.peers.delete(peer)
    })
  }

  private started(socket: Socket): void {
    const timer = this.waiting.get(socket)
    if (!timer) return
    clearTimeout(timer)
    this.waiting.delete(socket)
  }
}

/** An `Expect` other than `100-continue`: refused in the registry's shape (Node sent a bare 417). */
function answerUnmetExpectation(request: IncomingMessage, response: ServerResponse): void {
  const body = JSON.stringify(
    errorBody(
      'bad_request',
      `Expect: ${String(request.headers.expect).slice(0, 100)} is not taken; only 100-continue is`,
    ),
  )
  response.shouldKeepAlive = false
  response
    .writeHead(ERROR_CODES.bad_request.status, {
      'content-type': 'application/json; charset=utf-8',
      'content-length': Buffer.byteLength(body),
    })
    .end(body)
}

/** Answers a connection over a cap with its typed error and closes it once that is written. */
function refuse(socket: Socket, code: ErrorCode, message: string): void {
  const body = JSON.stringify(errorBody(code, message))
  const status = ERROR_CODES[code].status
  socket.on('error', () => undefined)
  socket.end(
    `HTTP/1.1 ${status} ${status === 429 ? 'Too Many Requests' : 'Service Unavailable'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n${body}`,
  )
  socket.destroySoon()
}
