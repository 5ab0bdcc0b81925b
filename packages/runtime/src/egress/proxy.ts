import { lookup } from 'node:dns/promises'
import { chmod, rm } from 'node:fs/promises'
import http from 'node:http'
import net from 'node:net'
import { forbiddenReason } from './address-guard.js'
import { decide, type EgressPolicy } from './policy.js'

export interface NetworkEvent {
  at: string
  host: string
  port: number
  method: string
  allowed: boolean
  reason: string
  address?: string | undefined
}

export interface EgressProxyOptions {
  socketPath: string
  policy: EgressPolicy
  /** Private addresses an operator explicitly lets sandboxes reach (e.g. an internal API). */
  privateExceptions?: ReadonlySet<string> | undefined
  onEvent: (event: NetworkEvent) => void
}

/**
 * A sandbox's only way out: an HTTP proxy (CONNECT for TLS, absolute-URI requests for plain
 * HTTP) on a unix socket in the sandbox's run dir. It checks every connection against the
 * allowlist, resolves names on the host and refuses private, loopback and link-local addresses
 * whatever the name resolved to, and reports each decision.
 */
export class EgressProxy {
  private readonly server: http.Server
  private readonly sockets = new Set<net.Socket>()

  constructor(private readonly options: EgressProxyOptions) {
    this.server = http.createServer((req, res) => void this.forward(req, res))
    this.server.on('connect', (req, socket: net.Socket, head) => void this.tunnel(req, socket, head))
    this.server.on('connection', (socket) => {
      this.sockets.add(socket)
      socket.once('close', () => this.sockets.delete(socket))
    })
  }

  async listen(): Promise<void> {
    await rm(this.options.socketPath, { force: true })
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject)
      this.server.listen(this.options.socketPath, () => resolve())
    })
    // The sandbox uid connects to it through the read-only bind of the run dir.
    await chmod(this.options.socketPath, 0o666)
  }

  private async resolve(host: string, port: number, method: string): Promise<string | undefined> {
    const record = (allowed: boolean, reason: string, address?: string) =>
      this.options.onEvent({ at: new Date().toISOString(), host, port, method, allowed, reason, address })
    const decision = decide(this.options.policy, host, port, method)
    if (!decision.allowed) {
      record(false, decision.reason)
      return undefined
    }
    let addresses: string[]
    try {
      addresses = net.isIP(host) ? [host] : (await lookup(host, { all: true })).map((a) => a.address)
    } catch {
      record(false, `cannot resolve ${host}`)
      return undefined
    }
    for (const address of addresses) {
      const reason = forbiddenReason(address, this.options.privateExceptions)
      if (reason) {
        record(false, reason, address)
        return undefined
      }
    }
    const address = addresses[0]
    record(true, decision.reason, address)
    return address
  }

  private async tunnel(req: http.IncomingMessage, client: net.Socket, head: Buffer): Promise<void> {
    client.on('error', () => undefined)
    const match = /^\[?([^\]]+?)\]?:(\d+)$/.exec(req.url ?? '')
    const host = match?.[1] ?? ''
    const port = Number(match?.[2] ?? 0)
    const address = host && port ? await this.resolve(host, port, 'CONNECT') : undefined
    if (!address) {
      client.end('HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\n\r\negress denied by Cairn policy\n')
      return
    }
    const upstream = net.connect(port, address)
    upstream.on('error', () => client.destroy())
    upstream.once('connect', () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n')
      if (head.length > 0) upstream.write(head)
      upstream.pipe(client)
      client.pipe(upstream)
    })
    client.once('close', () => upstream.destroy())
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
    const address = await this.resolve(target.hostname, port, req.method ?? 'GET')
    if (!address) {
      res.writeHead(403, { 'content-type': 'text/plain' }).end('egress denied by Cairn policy\n')
      return
    }
    const headers: http.OutgoingHttpHeaders = { ...req.headers, host: target.host }
    delete headers['proxy-connection']
    delete headers['proxy-authorization']
    const upstream = http.request(
      { host: address, port, method: req.method, path: `${target.pathname}${target.search}`, headers },
      (upstreamRes) => {
        res.writeHead(upstreamRes.statusCode ?? 502, upstreamRes.headers)
        upstreamRes.pipe(res)
      },
    )
    upstream.on('error', (error) => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' })
      res.end(`upstream error: ${error.message}\n`)
    })
    req.pipe(upstream)
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy()
    await new Promise<void>((resolve) => this.server.close(() => resolve()))
    await rm(this.options.socketPath, { force: true })
  }
}
