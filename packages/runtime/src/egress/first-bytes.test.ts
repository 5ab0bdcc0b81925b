import { mkdtemp, rm } from 'node:fs/promises'
import https from 'node:https'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import tls from 'node:tls'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type LocalEgress, startLocalEgress } from '../../../../test/helpers/local-egress.js'
import { EgressCa } from './egress-ca.js'
import { FIRST_BYTES_CAP, firstBytesRefusal, inspectFirstBytes } from './first-bytes.js'
import { EgressProxy, type NetworkEvent } from './proxy.js'

/** The ClientHello Node's TLS client sends for `servername` (undefined: none, as for an address). */
async function clientHello(servername: string | undefined): Promise<Buffer> {
  const chunks: Buffer[] = []
  const server = net.createServer((socket) => {
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk)
      const all = Buffer.concat(chunks)
      if (all.length >= 5 && all.length >= 5 + all.readUInt16BE(3)) socket.destroy()
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  await new Promise<void>((resolve) => {
    const socket = tls.connect({ host: '127.0.0.1', port, ...(servername ? { servername } : {}) })
    socket.on('error', () => resolve())
    socket.on('close', () => resolve())
  })
  server.close()
  return Buffer.concat(chunks)
}

describe('first bytes of a tunnel', () => {
  it('reads the server name of a real ClientHello, tells plain HTTP, and nothing else', async () => {
    const hello = await clientHello('API.Example.com')
    expect(inspectFirstBytes(hello)).toEqual({ kind: 'tls', serverName: 'api.example.com' })
    expect(inspectFirstBytes(await clientHello(undefined))).toEqual({ kind: 'tls', serverName: undefined })
    for (const cut of [1, 4, 5, 40, hello.length - 1])
      expect(inspectFirstBytes(hello.subarray(0, cut))).toEqual({ kind: 'partial' })

    const http = Buffer.from('GET /x HTTP/1.1\r\nHost: Site.Example:8080\r\nAccept: */*\r\n\r\n')
    expect(inspectFirstBytes(http)).toEqual({ kind: 'http' })
    expect(inspectFirstBytes(http.subarray(0, 10))).toEqual({ kind: 'partial' })
    // The request line is enough: no need to wait for the headers.
    expect(inspectFirstBytes(http.subarray(0, 20))).toEqual({ kind: 'http' })
    expect(inspectFirstBytes(Buffer.from('GET / HTTP/1.0\r\n\r\n'))).toEqual({ kind: 'http' })
    expect(inspectFirstBytes(Buffer.from('GET /\r\n'))).toEqual({ kind: 'http' })
    expect(inspectFirstBytes(Buffer.from('SSH-2.0-OpenSSH_9.2\r\n'))).toEqual({ kind: 'other' })
    expect(inspectFirstBytes(Buffer.from([0, 1, 2]))).toEqual({ kind: 'other' })

    // A handshake that is no ClientHello, and header blocks past the cap, are unreadable.
    const notHello = Buffer.from(hello)
    notHello[5] = 2
    expect(inspectFirstBytes(notHello).kind).toBe('unreadable')
    const endless = Buffer.concat([Buffer.from('GET /'), Buffer.alloc(FIRST_BYTES_CAP, 'a')])
    expect(inspectFirstBytes(endless).kind).toBe('unreadable')
  })

  it('refuses a name other than the tunnel host, or none, any name on a tunnel to an address, and relaying plain HTTP', () => {
    const tlsTo = (serverName: string | undefined) => ({ kind: 'tls' as const, serverName })
    expect(firstBytesRefusal('api.example.com', tlsTo('api.example.com'))).toBeUndefined()
    expect(firstBytesRefusal('API.example.com.', tlsTo('api.example.com'))).toBeUndefined()
    expect(firstBytesRefusal('api.example.com', tlsTo('API.example.com.'))).toBeUndefined()
    // Without a server name the host picks the site (its default, or the Host inside the TLS).
    expect(firstBytesRefusal('api.example.com', tlsTo(undefined))).toMatch(/without a server name/)
    expect(firstBytesRefusal('api.example.com', tlsTo('evil.example'))).toMatch(
      /TLS server name 'evil.example'/,
    )
    expect(firstBytesRefusal('api.example.com', { kind: 'other' })).toBeUndefined()
    expect(firstBytesRefusal('api.example.com', { kind: 'unreadable', why: 'x' })).toMatch(/unreadable/)
    // A second request on the connection could name any site: plain HTTP is never relayed.
    expect(firstBytesRefusal('api.example.com', { kind: 'http' })).toMatch(/request by request/)
    // A tunnel to an address was allowed for the address: it may name that address or nothing.
    expect(firstBytesRefusal('10.1.2.3', tlsTo('evil.example'))).toMatch(/TLS server name 'evil.example'/)
    expect(firstBytesRefusal('10.1.2.3', { kind: 'http' })).toMatch(/request by request/)
    expect(firstBytesRefusal('10.1.2.3', { kind: 'unreadable', why: 'x' })).toMatch(/unreadable/)
    expect(firstBytesRefusal('10.1.2.3', tlsTo(undefined))).toBeUndefined()
    expect(firstBytesRefusal('10.1.2.3', tlsTo('10.1.2.3'))).toBeUndefined()
    expect(firstBytesRefusal('2001:db8::1', tlsTo('2001:db8:0::1'))).toBeUndefined()
    expect(firstBytesRefusal('10.1.2.3', { kind: 'other' })).toBeUndefined()
  })

  it('sees plain HTTP and an SSLv2 ClientHello through the disguises a server still accepts', () => {
    const refused = (text: string | Buffer) =>
      firstBytesRefusal('api.example.com', inspectFirstBytes(Buffer.from(text)))
    // Empty lines before the request line, a lowercase method, several spaces, bare LF line ends.
    for (const request of [
      'GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\nGET / HTTP/1.1\r\nHost: evil.example\r\n\r\n',
      '\r\nGET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n',
      'get / HTTP/1.1\r\nHost: api.example.com\r\n\r\n',
      'GET  / HTTP/1.1\r\nHost: api.example.com\r\n\r\n',
      'GET / HTTP/1.1\nHost: api.example.com\n\n',
      'GET http://api.example.com/ HTTP/1.0\r\n\r\n',
      'GET /\r\n',
    ])
      expect(inspectFirstBytes(Buffer.from(request))).toEqual({ kind: 'http' })
    // HTTP/2 without TLS names its host in frames this check does not read.
    expect(refused('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n')).toBeDefined()
    // A TLS record of another type (change_cipher_spec, alert) ahead of the ClientHello.
    expect(refused(Buffer.from([0x14, 0x03, 0x03, 0x00, 0x01, 0x01]))).toBeDefined()
    expect(refused(Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x01, 0x00]))).toBeDefined()
    // An SSLv2-format ClientHello (two-byte length with the high bit, type 1, version 3.1): no SNI.
    const sslv2 = Buffer.from([0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10])
    expect(inspectFirstBytes(sslv2.subarray(0, 2))).toEqual({ kind: 'partial' })
    expect(refused(sslv2)).toMatch(/SSLv2/)
    // Still fine: protocols that are no HTTP.
    expect(refused('SSH-2.0-OpenSSH_9.2\r\n')).toBeUndefined()
    expect(refused('EHLO client.example\r\n')).toBeUndefined()
  })
})

describe('the egress proxy checks what a CONNECT tunnel carries', () => {
  let dir = ''
  let upstream: net.Server
  let egress: LocalEgress
  let upstreamPort = 0
  const received: Buffer[] = []
  const events: NetworkEvent[] = []

  beforeAll(async () => {
    // The host speaks first (like SSH), and keeps what it is sent.
    upstream = net.createServer((socket) => {
      socket.write('banner\n')
      socket.on('data', (chunk: Buffer) => received.push(chunk))
      socket.on('error', () => undefined)
    })
    egress = await startLocalEgress(upstream, {
      name: 'good.test',
      prefix: 'cairn-first-bytes-',
      options: (at) => ({
        policy: { allow: [`good.test:${at}`, `127.0.0.1:${at}`] },
        onEvent: (event) => events.push(event),
      }),
    })
    ;({ dir, port: upstreamPort } = egress)
  })

  afterAll(async () => {
    await egress?.close()
  })

  /** Opens a tunnel, sends `payload`, and returns what came back before the tunnel closed or 500 ms. */
  async function through(
    payload: Buffer,
    target = 'good.test',
  ): Promise<{ answer: string; closed: boolean }> {
    const socket = net.connect(path.join(dir, 'egress.sock'))
    socket.on('error', () => undefined)
    let answer = ''
    let closed = false
    socket.on('data', (chunk: Buffer) => {
      answer += chunk.toString('latin1')
    })
    socket.on('close', () => {
      closed = true
    })
    socket.write(`CONNECT ${target}:${upstreamPort} HTTP/1.1\r\nHost: ${target}:${upstreamPort}\r\n\r\n`)
    for (let i = 0; i < 50 && !answer.includes('banner\n'); i++) await new Promise((r) => setTimeout(r, 10))
    socket.write(payload)
    await new Promise((r) => setTimeout(r, 500))
    socket.destroy()
    return { answer, closed }
  }

  it('passes a ClientHello that names the tunnel host, and the host speaks first', async () => {
    received.length = 0
    const good = await clientHello('good.test')
    const tunnel = await through(good)
    expect(tunnel.answer).toMatch(/^HTTP\/1\.1 200 Connection Established\r\n\r\nbanner\n/)
    expect(tunnel.closed).toBe(false)
    expect(Buffer.concat(received).equals(good)).toBe(true)
  })

  it('closes a tunnel whose ClientHello names another site, or is in the SSLv2 format, before a byte reaches the host', async () => {
    received.length = 0
    events.length = 0
    const fronted = await through(await clientHello('evil.test'))
    expect(fronted.closed).toBe(true)
    const sslv2 = Buffer.from([
      0x80,
      0x2e,
      0x01,
      0x03,
      0x01,
      0x00,
      0x15,
      0x00,
      0x00,
      0x00,
      0x10,
      ...Buffer.alloc(37),
    ])
    expect((await through(sslv2)).closed).toBe(true)
    expect(received).toEqual([])
    const denied = events.filter((e) => !e.allowed).map((e) => e.reason)
    expect(denied).toEqual([
      "TLS server name 'evil.test' is not the tunnel's host 'good.test'",
      'unreadable start of the connection (an SSLv2-format ClientHello, which names no server)',
    ])
  })

  it('closes a tunnel to a name whose ClientHello names nothing, and one to an address that names a site', async () => {
    received.length = 0
    events.length = 0
    // No SNI: the Host inside the TLS (evil.test) would pick the site, unseen.
    expect((await through(await clientHello(undefined))).closed).toBe(true)
    expect((await through(await clientHello('evil.test'), '127.0.0.1')).closed).toBe(true)
    expect(received).toEqual([])
    expect(events.filter((e) => !e.allowed).map((e) => e.reason)).toEqual([
      "TLS ClientHello without a server name on a tunnel to 'good.test'",
      "TLS server name 'evil.test' is not the tunnel's address '127.0.0.1'",
    ])
    // A tunnel to the address that names nothing, or the address, goes through.
    const bare = await clientHello(undefined)
    expect((await through(bare, '127.0.0.1')).closed).toBe(false)
    expect(Buffer.concat(received).equals(bare)).toBe(true)
  })
})

describe('the egress proxy, terminating TLS for a bound secret', () => {
  let dir = ''
  let proxy: EgressProxy
  let upstream: https.Server
  let port = 0
  const seen: { host: string | undefined; url: string | undefined; authorization: string | undefined }[] = []

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-first-bytes-tls-'))
    const ca = await EgressCa.load(path.join(dir, 'ca'))
    upstream = https.createServer(
      { SNICallback: (name, done) => void ca.contextFor(name).then((c) => done(null, c)) },
      (req, res) => {
        seen.push({ host: req.headers.host, url: req.url, authorization: req.headers.authorization })
        res.end('ok\n')
      },
    )
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve))
    port = (upstream.address() as net.AddressInfo).port
    proxy = new EgressProxy({
      socketPath: path.join(dir, 'egress.sock'),
      policy: { allow: [`good.test:${port}`] },
      privateExceptions: new Set(['127.0.0.1']),
      hosts: new Map([['good.test', ['127.0.0.1']]]),
      onEvent: () => undefined,
      secrets: [
        { name: 'TOKEN', standIn: 'cairn-proxy-secret-t', value: 'real-t', hosts: [`good.test:${port}`] },
      ],
      ca,
      upstreamCaPems: [ca.certificatePem],
    })
    await proxy.listen()
  })

  afterAll(async () => {
    await proxy?.close()
    upstream?.close()
    await rm(dir, { recursive: true, force: true })
  })

  /** Sends `request` through a terminated tunnel to good.test and returns the answer's status line. */
  async function send(request: string): Promise<string> {
    const raw = net.connect(path.join(dir, 'egress.sock'))
    raw.write(`CONNECT good.test:${port} HTTP/1.1\r\nHost: good.test:${port}\r\n\r\n`)
    await new Promise<void>((resolve) => raw.once('data', () => resolve()))
    const ca = await EgressCa.load(path.join(dir, 'ca'))
    const secure = tls.connect({ socket: raw, servername: 'good.test', ca: ca.certificatePem })
    let answer = ''
    secure.on('data', (chunk: Buffer) => {
      answer += chunk.toString()
    })
    secure.write(request)
    await new Promise<void>((resolve) => {
      secure.on('close', () => resolve())
      secure.on('error', () => resolve())
    })
    return answer.split('\r\n')[0] ?? ''
  }

  it('sends the secret to the bound host only, whatever host the request names', async () => {
    const auth = 'Authorization: Bearer cairn-proxy-secret-t\r\nConnection: close\r\n\r\n'
    expect(await send(`GET /a HTTP/1.1\r\nHost: good.test:${port}\r\n${auth}`)).toBe('HTTP/1.1 200 OK')
    await send(`GET /b HTTP/1.1\r\nHost: evil.test\r\n${auth}`)
    await send(`GET http://evil.test/c HTTP/1.1\r\nHost: good.test:${port}\r\n${auth}`)
    for (const request of seen) expect(request.host).toBe(`good.test:${port}`)
    for (const request of seen) expect(request.url?.startsWith('/')).toBe(true)
    expect(seen[0]).toEqual({ host: `good.test:${port}`, url: '/a', authorization: 'Bearer real-t' })
  })
})
