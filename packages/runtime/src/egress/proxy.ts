import { chmod, rm } from 'node:fs/promises'
import http from 'node:http'
import https from 'node:https'
import net from 'node:net'
import { pipeline } from 'node:stream'
import tls from 'node:tls'
import { canonicalAddress, forbiddenReason, hostAddresses } from './address-guard.js'
import type { EgressCa } from './egress-ca.js'
import { type FirstBytes, firstBytesRefusal, inspectFirstBytes } from './first-bytes.js'
import { endToEndHeaders, forwardedRequestHeaders } from './hop-by-hop.js'
import { DEFAULT_LOOKUP_LIMITS, egressName, type LookupLimits, NameResolver } from './names.js'
import { decide, type EgressPolicy } from './policy.js'
import {
  askPlainAnswer,
  type ProxySecret,
  plainBody,
  SecretScrubber,
  scrubBytes,
  secretsBoundTo,
  swapInSecrets,
  swapOutSecrets,
} from './proxy-secrets.js'

export interface NetworkEvent {
  at: string
  host: string
  port: number
  method: string
  allowed: boolean
  reason: string
  address?: string | undefined
}

/** The operator's egress settings: the same for every sandbox a server runs. */
export interface EgressSite {
  /** Private addresses an operator explicitly lets sandboxes reach (e.g. an internal API). */
  privateExceptions?: ReadonlySet<string> | undefined
  /**
   * Names the operator maps to addresses, looked up before DNS (like /etc/hosts, for the proxy
   * alone): internal services without public DNS. The address guard still applies to them.
   */
  hosts?: ReadonlyMap<string, readonly string[]> | undefined
  /** Bounds on each sandbox's egress (each field defaults to `DEFAULT_EGRESS_LIMITS`'s). */
  limits?: Partial<EgressLimits> | undefined
}

/** What one sandbox's egress may hold at once, like its memory: connections, idle time, lookups. */
export interface EgressLimits extends LookupLimits {
  /**
   * Connections of one sandbox to its proxy at once (each CONNECT tunnel and each proxied
   * request holds one, and at most one connection upstream): more are answered 429 and closed.
   */
  maxConnections: number
  /** A connection (tunnel or proxied request) with no byte either way this long is closed. */
  idleTimeoutMs: number
}

export const DEFAULT_EGRESS_LIMITS: EgressLimits = {
  maxConnections: 128,
  idleTimeoutMs: 300_000,
  ...DEFAULT_LOOKUP_LIMITS,
}

/** `given` over the defaults, fields left undefined keeping theirs. */
export function egressLimits(given: Partial<EgressLimits> | undefined): EgressLimits {
  const set = Object.entries(given ?? {}).filter(([, value]) => value !== undefined)
  return { ...DEFAULT_EGRESS_LIMITS, ...Object.fromEntries(set) }
}

/** A sandbox's way out: its allowlist, the operator's settings, and where decisions are logged. */
export interface EgressRoute extends EgressSite {
  policy: EgressPolicy
  onEvent: (event: NetworkEvent) => void
}

export interface EgressProxyOptions extends EgressRoute {
  socketPath: string
  /** `proxy`-scoped secrets: requests to their hosts get the real value in place of the stand-in. */
  secrets?: readonly ProxySecret[] | undefined
  /** Signs host certificates so TLS towards a host with a bound secret can be terminated. */
  ca?: EgressCa | undefined
  /** CA certificates (PEM) trusted for upstream TLS besides the system ones (internal hosts, tests). */
  upstreamCaPems?: readonly string[] | undefined
}

/** Where a terminated TLS connection goes, remembered per decrypted socket. */
interface TerminatedTarget {
  host: string
  port: number
  address: string
  secrets: ProxySecret[]
}

function deny(res: http.ServerResponse): void {
  res.writeHead(403, { 'content-type': 'text/plain' }).end('egress denied by Cairn policy\n')
}

/**
 * A 502 for the agent (if still possible). Its text may quote the upstream (a certificate's names,
 * a header it sent), so it is scrubbed of the bound secrets like the answer would have been.
 */
function badGateway(res: http.ServerResponse, text: string, secrets: readonly ProxySecret[]): void {
  if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' })
  res.end(scrubBytes(Buffer.from(`${text}\n`), secrets))
}

/** Streams the agent's request body upstream; an upstream failure becomes a 502. */
function sendThrough(
  req: http.IncomingMessage,
  upstream: http.ClientRequest,
  res: http.ServerResponse,
  secrets: readonly ProxySecret[],
): void {
  upstream.on('error', (error) => badGateway(res, `upstream error: ${error.message}`, secrets))
  // A client that goes away (or idles out) takes its upstream request with it.
  res.once('close', () => {
    if (!res.writableFinished) upstream.destroy()
  })
  req.pipe(upstream)
}

/**
 * Sends an upstream answer on to the agent. With secrets bound to the host, their values become
 * stand-ins again and any piece of one is masked, in the headers and in the body (decoded first;
 * its length then changes); an answer that cannot be read as plain bytes is refused (502).
 */
function relayResponse(
  upstreamRes: http.IncomingMessage,
  res: http.ServerResponse,
  secrets: readonly ProxySecret[],
): void {
  const status = upstreamRes.statusCode ?? 502
  if (secrets.length === 0) {
    res.writeHead(status, endToEndHeaders(upstreamRes.headers))
    upstreamRes.pipe(res)
    return
  }
  const plain = plainBody(status, upstreamRes.headers)
  if ('refusal' in plain) {
    upstreamRes.destroy()
    badGateway(res, `egress refused ${plain.refusal}`, secrets)
    return
  }
  const headers = endToEndHeaders(swapOutSecrets(upstreamRes.headers, secrets))
  delete headers['content-length']
  delete headers['content-encoding']
  res.writeHead(status, headers)
  const stages: NodeJS.ReadWriteStream[] = [...plain.decoders, new SecretScrubber(secrets)]
  pipeline([upstreamRes, ...stages, res], (error) => {
    if (error) res.destroy()
  })
}

/**
 * A sandbox's only way out: an HTTP proxy (CONNECT for TLS, absolute-URI requests for plain
 * HTTP) on a unix socket in the sandbox's run dir. It checks every connection against the
 * allowlist, resolves names on the host and refuses private, loopback and link-local addresses
 * whatever the name resolved to, and reports each decision.
 *
 * A CONNECT to a host bound to a `proxy` secret is not tunnelled but terminated: the proxy
 * answers TLS with a certificate from the per-install CA (which the sandbox trusts), swaps the
 * secret's stand-in for its value in the request headers, and re-encrypts towards the host,
 * verifying its certificate. Every other CONNECT stays an opaque tunnel.
 */
export class EgressProxy {
  /** Accepts the sandbox's connections and admits them (up to the cap) to `server`. */
  private readonly listener: net.Server
  /** Serves admitted connections (never listens itself). */
  private readonly server: http.Server
  /** Serves the requests of terminated TLS connections (never listens itself). */
  private readonly terminated: http.Server
  /** Serves plain HTTP requests sent inside CONNECT tunnels (never listens itself). */
  private readonly tunnelled: http.Server
  private readonly tunnelTargets = new WeakMap<net.Socket, { host: string; port: number }>()
  private readonly targets = new WeakMap<net.Socket, TerminatedTarget>()
  private readonly upstreamAgent: https.Agent
  /** This sandbox's own pool of plain HTTP connections (never shared with another sandbox's). */
  private readonly httpAgent: http.Agent
  private readonly sockets = new Set<net.Socket>()
  /** Connections past the cap, answered 429 and about to close. */
  private readonly refusing = new Set<net.Socket>()
  private readonly limits: EgressLimits
  private readonly names: NameResolver
  /** Whether the cap was reported since the sandbox last dropped below it (one event per episode). */
  private capReported = false

  constructor(private readonly options: EgressProxyOptions) {
    this.limits = egressLimits(options.limits)
    this.names = new NameResolver(options.hosts, this.limits)
    const extraCa = options.upstreamCaPems ?? []
    // Upstream connections kept for reuse count within the cap too, and a kept one unused for 5 s
    // is closed (a full pool would make a request to another host wait for one to close).
    const pooled = {
      keepAlive: true,
      maxTotalSockets: this.limits.maxConnections,
      maxFreeSockets: 16,
      timeout: 5_000,
    }
    this.httpAgent = new http.Agent(pooled)
    this.upstreamAgent = new https.Agent({
      ...pooled,
      ...(extraCa.length > 0 ? { ca: [...tls.rootCertificates, ...extraCa] } : {}),
    })
    // No error in a request's path ends the process: each handler's failure ends its connection.
    this.terminated = http.createServer((req, res) =>
      this.guard(this.forwardTerminated(req, res), req.socket, res),
    )
    this.server = http.createServer((req, res) => this.guard(this.forward(req, res), req.socket, res))
    this.tunnelled = http.createServer((req, res) =>
      this.guard(this.forwardTunnelled(req, res), req.socket, res),
    )
    this.server.on('connect', (req, socket: net.Socket, head) =>
      this.guard(this.tunnel(req, socket, head), socket),
    )
    // A connection with no byte either way for the idle timeout is closed (the servers' default).
    this.server.timeout = this.limits.idleTimeoutMs
    this.terminated.timeout = this.limits.idleTimeoutMs
    this.tunnelled.timeout = this.limits.idleTimeoutMs
    // Half-open like an HTTP server's: a client's FIN ends its side of a tunnel, not the answer.
    this.listener = net.createServer({ allowHalfOpen: true }, (socket) => this.admit(socket))
    // Accept failures (EMFILE) are the listener's events, not the process's end.
    this.listener.on('error', () => undefined)
  }

  /** Hands a new connection to the HTTP server, or answers 429 when the sandbox is at its cap. */
  private admit(socket: net.Socket): void {
    socket.on('error', () => undefined)
    if (this.sockets.size >= this.limits.maxConnections) {
      this.refuse(socket)
      return
    }
    this.sockets.add(socket)
    socket.once('close', () => {
      this.sockets.delete(socket)
      if (this.sockets.size < this.limits.maxConnections) this.capReported = false
    })
    this.server.emit('connection', socket)
  }

  /**
   * Answers a connection past the cap 429 and closes it once the client has read that (it ends,
   * or sends its request into our half-closed socket) or within a second; past as many refusals
   * in flight as the cap, a connection is closed at once.
   */
  private refuse(socket: net.Socket): void {
    const { maxConnections } = this.limits
    if (!this.capReported) {
      this.capReported = true
      const reason = `too many egress connections at once (limit ${maxConnections})`
      this.report({ host: '', port: 0, method: 'CONNECT', allowed: false, reason })
    }
    if (this.refusing.size >= maxConnections) {
      socket.destroy()
      return
    }
    this.refusing.add(socket)
    const text = `egress refused: this sandbox has ${maxConnections} connections open, its limit\n`
    socket.end(
      `HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: ${text.length}\r\n\r\n${text}`,
    )
    const timer = setTimeout(() => socket.destroy(), 1_000)
    socket.once('data', () => socket.destroy())
    socket.once('end', () => socket.destroy())
    socket.once('close', () => {
      clearTimeout(timer)
      this.refusing.delete(socket)
    })
  }

  /**
   * Ends a connection whose handler failed (out of descriptors, an unexpected throw) with a 503
   * when it can still answer, so the failure stays this connection's.
   */
  private guard(work: Promise<void>, socket: net.Socket, res?: http.ServerResponse): void {
    work.catch((error: NodeJS.ErrnoException) => {
      const text = `egress proxy error: ${error?.code ?? error?.message ?? String(error)}\n`
      if (res && !res.headersSent) {
        res.writeHead(503, { 'content-type': 'text/plain', connection: 'close' }).end(text)
      } else if (!res && socket.writable && socket.bytesWritten === 0) {
        socket.end(`HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\r\n${text}`)
      } else {
        socket.destroy()
      }
    })
  }

  async listen(): Promise<void> {
    await rm(this.options.socketPath, { force: true })
    await new Promise<void>((resolve, reject) => {
      this.listener.once('error', reject)
      this.listener.listen(this.options.socketPath, () => {
        this.listener.off('error', reject)
        resolve()
      })
    })
    // The sandbox uid connects to it through the read-only bind of the run dir.
    await chmod(this.options.socketPath, 0o666)
  }

  private report(event: Omit<NetworkEvent, 'at'>): void {
    this.options.onEvent({ at: new Date().toISOString(), ...event })
  }

  /** `host` must be spelled by `egressName`: the allowlist, the map and DNS then read one name. */
  private async resolve(host: string, port: number, method: string, note = ''): Promise<string | undefined> {
    const record = (allowed: boolean, reason: string, address?: string) =>
      this.report({ host, port, method, allowed, reason, address })
    const decision = decide(this.options.policy, host, port, method)
    if (!decision.allowed) {
      record(false, decision.reason)
      return undefined
    }
    // An address in any spelling (`127.1`, `[0::ffff:7f00:1]`) is that address, not a name.
    const literal = canonicalAddress(host)
    let addresses: string[]
    try {
      addresses = literal ? [literal] : await this.names.addresses(host)
    } catch (error) {
      record(false, (error as Error).message || `cannot resolve ${host}`)
      return undefined
    }
    // Judged on the addresses themselves, and the connection goes to the address judged (in its
    // canonical form, which no resolver reads again): a name cannot rebind in between.
    const own = hostAddresses()
    const checked: string[] = []
    for (const address of addresses) {
      const reason = forbiddenReason(address, this.options.privateExceptions, own)
      const canonical = canonicalAddress(address)
      if (reason || !canonical) {
        record(false, reason ?? `${address} is not an IP address`, address)
        return undefined
      }
      checked.push(canonical)
    }
    const address = checked[0]
    if (address === undefined) {
      record(false, `${host} has no address`)
      return undefined
    }
    record(true, `${decision.reason}${note}`, address)
    return address
  }

  private async tunnel(req: http.IncomingMessage, client: net.Socket, head: Buffer): Promise<void> {
    client.on('error', () => undefined)
    const match = /^\[?([^\]]+?)\]?:(\d+)$/.exec(req.url ?? '')
    const host = egressName(match?.[1] ?? '')
    const port = Number(match?.[2] ?? 0)
    const bound = this.boundSecrets(host, port)
    const terminate = bound.length > 0 && this.options.ca !== undefined
    const note = terminate ? `; TLS terminated for ${bound.map((s) => s.name).join(', ')}` : ''
    const address = host && port ? await this.resolve(host, port, 'CONNECT', note) : undefined
    if (!address) {
      client.end('HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\n\r\negress denied by Cairn policy\n')
      return
    }
    if (terminate) {
      await this.terminate(client, head, { host, port, address, secrets: bound })
      return
    }
    // The tunnel is idle when neither side sends: the client socket sees both ways.
    client.setTimeout(this.limits.idleTimeoutMs, () => client.destroy())
    const upstream = net.connect(port, address)
    upstream.on('error', () => client.destroy())
    // Until its bytes are relayed or served, a client that ends is gone (it would stay half-open).
    let handed = false
    client.once('end', () => {
      if (!handed) client.destroy()
    })
    upstream.once('connect', () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n')
      // The host may speak first (SSH, SMTP…): its bytes flow at once. The client's go on only
      // once its first bytes name the host the tunnel was allowed for (TLS SNI), or are served
      // request by request when they are plain HTTP.
      upstream.pipe(client)
      this.checkFirstBytes(client, head, (first, seen) => {
        handed = true
        if (seen.kind === 'http') {
          upstream.unpipe(client)
          upstream.destroy()
          this.serveTunnelledHttp(client, first, host, port)
          return
        }
        const refusal = firstBytesRefusal(host, seen)
        if (refusal) {
          this.report({ host, port, method: 'CONNECT', allowed: false, reason: refusal, address })
          client.destroy()
          upstream.destroy()
          return
        }
        upstream.write(first)
        client.pipe(upstream)
      })
    })
    client.once('close', () => upstream.destroy())
  }

  /**
   * Collects the client's first bytes of a tunnel until they say what it speaks and which name it
   * talks to (or that they cannot), then calls `done` with them and what they say.
   */
  private checkFirstBytes(
    client: net.Socket,
    head: Buffer,
    done: (first: Buffer, seen: FirstBytes) => void,
  ): void {
    let first = head
    const settle = (): boolean => {
      const seen = inspectFirstBytes(first)
      if (seen.kind === 'partial') return false
      client.off('data', onData)
      client.pause()
      done(first, seen)
      return true
    }
    const onData = (chunk: Buffer) => {
      first = Buffer.concat([first, chunk])
      settle()
    }
    if (settle()) return
    client.on('data', onData)
  }

  /**
   * Serves plain HTTP sent inside a tunnel request by request, each as a proxy request for the
   * tunnel's host (its `Host` is that name, an absolute-form target is refused): the allowlist,
   * method rules, address guard and proxy secrets judge every request, not just the first, so a
   * pipelined second request cannot name another site.
   */
  private serveTunnelledHttp(client: net.Socket, first: Buffer, host: string, port: number): void {
    client.unshift(first)
    this.tunnelTargets.set(client, { host, port })
    this.tunnelled.emit('connection', client)
    client.resume()
  }

  private async forwardTunnelled(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const target = this.tunnelTargets.get(req.socket)
    if (!target || !(req.url ?? '').startsWith('/')) {
      res.writeHead(400, { 'content-type': 'text/plain' }).end('origin-form request target required\n')
      return
    }
    const authority = target.host.includes(':')
      ? `[${target.host}]:${target.port}`
      : `${target.host}:${target.port}`
    req.url = `http://${authority}${req.url}`
    await this.forward(req, res)
  }

  private boundSecrets(host: string, port: number): ProxySecret[] {
    return host && port ? secretsBoundTo(this.options.secrets ?? [], host, port) : []
  }

  /** Answers TLS itself for a host with a bound secret; requests then go to `forwardTerminated`. */
  private async terminate(client: net.Socket, head: Buffer, target: TerminatedTarget): Promise<void> {
    let secureContext: tls.SecureContext
    try {
      secureContext = await (this.options.ca as EgressCa).contextFor(target.host)
    } catch {
      client.end('HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain\r\n\r\nno certificate for host\n')
      return
    }
    client.write('HTTP/1.1 200 Connection Established\r\n\r\n')
    if (head.length > 0) client.unshift(head)
    const secure = new tls.TLSSocket(client, { isServer: true, secureContext, ALPNProtocols: ['http/1.1'] })
    secure.on('error', () => client.destroy())
    this.targets.set(secure, target)
    this.terminated.emit('connection', secure)
  }

  private async forwardTerminated(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const target = this.targets.get(req.socket)
    if (!target) {
      res.writeHead(500).end()
      return
    }
    const method = req.method ?? 'GET'
    // Inside the tunnel the method is visible: method rules apply to HTTPS here too.
    const decision = decide(this.options.policy, target.host, target.port, method)
    if (!decision.allowed) {
      const { host, port, address } = target
      this.report({ host, port, method, allowed: false, reason: decision.reason, address })
      deny(res)
      return
    }
    // The request must be for the tunnel's host: an absolute-form target or another Host would
    // ask the shared address (a CDN's) for another site, with the secret swapped in (fronting).
    if (!(req.url ?? '/').startsWith('/')) {
      res.writeHead(400, { 'content-type': 'text/plain' }).end('origin-form request target required\n')
      return
    }
    const headers = forwardedRequestHeaders(req.headers, swapInSecrets(req.headers, target.secrets).headers)
    headers.host = target.port === 443 ? target.host : `${target.host}:${target.port}`
    // A whole, uncompressed answer can be scrubbed of a value the host echoes back.
    askPlainAnswer(headers)
    const upstream = https.request(
      {
        host: target.address,
        port: target.port,
        method,
        path: req.url ?? '/',
        headers,
        agent: this.upstreamAgent,
        ...(net.isIP(target.host) ? {} : { servername: target.host }),
        // The connection goes to the resolved address; the certificate must still name the host.
        checkServerIdentity: (_name, cert) => tls.checkServerIdentity(target.host, cert),
      },
      (upstreamRes) => relayResponse(upstreamRes, res, target.secrets),
    )
    sendThrough(req, upstream, res, target.secrets)
  }

  private async forward(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    let target: URL
    try {
      target = new URL(req.url ?? '')
    } catch {
      res.writeHead(400).end('absolute URL required (use this as an HTTP proxy)\n')
      return
    }
    if (target.protocol !== 'http:') {
      res.writeHead(400).end('only http:// is proxied this way; https goes through CONNECT\n')
      return
    }
    const port = Number(target.port || 80)
    // An IPv6 host keeps its brackets in a URL; the allowlist and the guard take the address.
    const hostname = egressName(target.hostname)
    const address = await this.resolve(hostname, port, req.method ?? 'GET')
    if (!address) {
      deny(res)
      return
    }
    const bound = this.boundSecrets(hostname, port)
    const headers: http.OutgoingHttpHeaders = {
      ...forwardedRequestHeaders(req.headers, swapInSecrets(req.headers, bound).headers),
      host: target.host,
    }
    if (bound.length > 0) askPlainAnswer(headers)
    const upstream = http.request(
      {
        host: address,
        port,
        method: req.method,
        path: `${target.pathname}${target.search}`,
        headers,
        // A connection that carried a secret is not reused: state a host keeps per connection
        // (NTLM-style authentication) must not reach another host on the same address.
        agent: bound.length > 0 ? false : this.httpAgent,
      },
      (upstreamRes) => relayResponse(upstreamRes, res, bound),
    )
    sendThrough(req, upstream, res, bound)
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy()
    this.names.close()
    this.upstreamAgent.destroy()
    this.httpAgent.destroy()
    await new Promise<void>((resolve) => this.listener.close(() => resolve()))
    await rm(this.options.socketPath, { force: true })
  }
}
