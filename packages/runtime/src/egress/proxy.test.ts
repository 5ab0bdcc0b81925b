import http from 'node:http'
import net from 'node:net'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type LocalEgress, startLocalEgress } from '../../../../test/helpers/local-egress.js'

describe('the egress proxy and keep-alive', () => {
  let socketPath = ''
  let upstream: http.Server
  let egress: LocalEgress
  let port = 0
  /** Connections the upstream accepted, and the hop-by-hop headers its requests carried. */
  let upstreamConnections = 0
  const hopSeen: (string | undefined)[] = []
  /** The `Host` of every request the upstream answered. */
  const hostsSeen: (string | undefined)[] = []

  beforeAll(async () => {
    // An upstream that says keep-alive (as most SSE handlers do) and names a hop-by-hop header.
    upstream = http.createServer((req, res) => {
      hopSeen.push(req.headers['x-hop-request'] ?? req.headers['keep-alive'])
      hostsSeen.push(req.headers.host)
      res.writeHead(200, {
        connection: 'keep-alive, x-hop',
        'keep-alive': 'timeout=30',
        'x-hop': 'only for the next hop',
        'content-type': 'text/plain',
        'content-length': String(`ok ${req.url}\n`.length),
      })
      res.end(`ok ${req.url}\n`)
    })
    upstream.on('connection', () => upstreamConnections++)
    egress = await startLocalEgress(upstream, { prefix: 'cairn-keepalive-' })
    ;({ socketPath, port } = egress)
  })

  afterAll(async () => {
    await egress?.close()
  })

  it('serves several calls of a keep-alive client on one socket, and keeps the upstream connection', async () => {
    upstreamConnections = 0
    hopSeen.length = 0
    let proxyConnections = 0
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    // The proxy on its unix socket, as a client with HTTP_PROXY set talks to it.
    agent.createConnection = ((_options: unknown, done?: unknown) => {
      proxyConnections++
      const socket = net.connect(socketPath)
      if (typeof done === 'function') socket.once('connect', () => done(null, socket))
      return socket
    }) as typeof agent.createConnection
    const call = (n: number) =>
      new Promise<{ status: number; body: string; headers: http.IncomingHttpHeaders }>((resolve, reject) => {
        const req = http.request(
          {
            agent,
            host: 'up.test',
            port,
            path: `http://up.test:${port}/call-${n}`,
            headers: { connection: 'keep-alive, x-hop-request', 'x-hop-request': 'client hop' },
          },
          (res) => {
            let body = ''
            res.on('data', (chunk: Buffer) => {
              body += chunk
            })
            res.on('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }))
          },
        )
        req.on('error', reject)
        req.end()
      })
    const answers = []
    for (let n = 1; n <= 4; n++) answers.push(await call(n))
    agent.destroy()
    expect(answers.map((a) => `${a.status} ${a.body}`)).toEqual(
      [1, 2, 3, 4].map((n) => `200 ok /call-${n}\n`),
    )
    expect(proxyConnections).toBe(1)
    expect(upstreamConnections).toBe(1)
    // Hop-by-hop headers, and those the other side names in Connection, stop at the proxy.
    for (const { headers } of answers) {
      expect(headers['x-hop']).toBeUndefined()
      // The proxy's own keep-alive terms for this connection, not the upstream's.
      expect(headers['keep-alive']).not.toBe('timeout=30')
    }
    expect(hopSeen).toEqual([undefined, undefined, undefined, undefined])
  })

  it('serves plain HTTP in a CONNECT tunnel request by request, each for the tunnel host only', async () => {
    hostsSeen.length = 0
    const socket = net.connect(socketPath)
    let answer = ''
    socket.on('data', (chunk: Buffer) => {
      answer += chunk.toString('latin1')
    })
    socket.write(`CONNECT up.test.:${port} HTTP/1.1\r\nHost: up.test:${port}\r\n\r\n`)
    // Pipelined: the second names another site, the third asks for it in absolute form.
    socket.write(
      `GET /one HTTP/1.1\r\nHost: up.test:${port}\r\n\r\n` +
        'GET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n' +
        'GET http://evil.test/three HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n',
    )
    await new Promise<void>((resolve) => socket.once('close', () => resolve()))
    const statuses = [...answer.matchAll(/HTTP\/1\.1 \d{3} [^\r]*/g)].map((match) => match[0])
    expect(statuses).toEqual([
      'HTTP/1.1 200 Connection Established',
      'HTTP/1.1 200 OK',
      'HTTP/1.1 200 OK',
      'HTTP/1.1 400 Bad Request',
    ])
    expect(answer).toContain('ok /one\n')
    expect(answer).toContain('ok /two\n')
    expect(hostsSeen).toEqual([`up.test:${port}`, `up.test:${port}`])
  })

  it('closes a connection whose client asked for close, whatever the upstream says', async () => {
    // The in-sandbox forwarder's way: one request per connection, `Connection: close`.
    const socket = net.connect(socketPath)
    socket.write(
      `GET http://up.test:${port}/once HTTP/1.1\r\nHost: up.test:${port}\r\nConnection: close\r\n\r\n`,
    )
    let answer = ''
    socket.on('data', (chunk: Buffer) => {
      answer += chunk.toString('latin1')
    })
    await new Promise<void>((resolve) => socket.once('close', () => resolve()))
    const [head = '', body] = answer.split('\r\n\r\n')
    expect(head.split('\r\n')[0]).toBe('HTTP/1.1 200 OK')
    expect(head.toLowerCase()).toContain('\r\nconnection: close')
    expect(head.toLowerCase()).not.toContain('keep-alive')
    expect(body).toBe('ok /once\n')
  })
})

describe('the egress proxy refusing an answer of a host with a proxy secret', () => {
  const VALUE = 'sk-Value-0123456789ABCDEF'
  let dir = ''
  let upstream: http.Server
  let egress: LocalEgress
  let port = 0

  beforeAll(async () => {
    // Names the value it was sent as its content coding: the refusal must not quote it.
    upstream = http.createServer((req, res) => {
      res.writeHead(200, { 'content-encoding': String(req.headers.authorization), 'content-length': '2' })
      res.end('xx')
    })
    egress = await startLocalEgress(upstream, {
      prefix: 'cairn-refusal-',
      options: (at) => ({
        secrets: [{ name: 'K', standIn: 'cairn-proxy-secret-k', value: VALUE, hosts: [`up.test:${at}`] }],
      }),
    })
    ;({ dir, port } = egress)
  })

  afterAll(async () => {
    await egress?.close()
  })

  it('answers 502 without quoting the value', async () => {
    const socket = net.connect(path.join(dir, 'egress.sock'))
    socket.write(
      `GET http://up.test:${port}/ HTTP/1.1\r\nHost: up.test\r\nAuthorization: cairn-proxy-secret-k\r\nConnection: close\r\n\r\n`,
    )
    let answer = ''
    socket.on('data', (chunk: Buffer) => {
      answer += chunk.toString('latin1')
    })
    await new Promise<void>((resolve) => socket.once('close', () => resolve()))
    expect(answer.split('\r\n')[0]).toBe('HTTP/1.1 502 Bad Gateway')
    expect(answer).toContain("egress refused content coding 'cairn-proxy-secret-k'")
    for (let at = 0; at + 8 <= VALUE.length; at++)
      expect(answer.toLowerCase()).not.toContain(VALUE.slice(at, at + 8).toLowerCase())
  })
})
