import net from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { Api, packDir } from '../helpers/server.js'
import { PeerClient, type ServerProcess, startServerProcess } from '../helpers/server-process.js'

// The server runs in its own process under 1,024 descriptors, so that the connections of one
// test client are enough to exhaust them (a server's limit is 20,000 here; the attack is the same).
const NOFILE = 1024
const PER_PEER = 100
const HEADERS_TIMEOUT_MS = 3000
const REQUEST_TIMEOUT_MS = 4000

/** Connections from `localAddress` that never send a byte; with `refill`, each one closed is opened again. */
class Flood {
  readonly held = new Set<net.Socket>()
  private stopped = false
  refused = 0

  constructor(
    private readonly port: number,
    private readonly localAddress: string,
    private readonly refill: boolean,
  ) {}

  async open(count: number): Promise<void> {
    await Promise.all(Array.from({ length: count }, () => this.one()))
  }

  private one(): Promise<void> {
    return new Promise((resolve) => {
      const socket = net.connect({ port: this.port, host: '127.0.0.1', localAddress: this.localAddress })
      socket.on('error', () => undefined)
      socket.once('connect', () => {
        this.held.add(socket)
        resolve()
      })
      socket.once('data', (chunk: Buffer) => {
        if (/^HTTP\/1\.1 (429|503)/.test(chunk.toString())) this.refused++
      })
      socket.once('close', () => {
        this.held.delete(socket)
        resolve()
        if (this.refill && !this.stopped) setTimeout(() => void this.one(), 1000).unref()
      })
    })
  }

  stop(): void {
    this.stopped = true
    for (const socket of this.held) socket.destroy()
  }
}

let server: ServerProcess
let session: string
const floods: Flood[] = []
const clients: PeerClient[] = []

beforeAll(async () => {
  server = await startServerProcess(
    {
      spareLaunchers: 0,
      operatorLimits: {
        maxConnectionsPerPeer: PER_PEER,
        headersTimeoutMs: HEADERS_TIMEOUT_MS,
        requestTimeoutMs: REQUEST_TIMEOUT_MS,
      },
    },
    NOFILE,
  )
  const api = new Api(server.url, server.key)
  const project = await makeProject({
    'cairn.yaml': 'name: echo\ncommand: python3 echo.py\n',
    'echo.py': 'while True:\n    print("echo", input())\n',
  })
  expect((await api.call('POST', '/v1/agents', await packDir(project))).status).toBe(201)
  session = (await api.createSession('echo')).id
}, 120_000)

afterAll(async () => {
  for (const flood of floods) flood.stop()
  for (const client of clients) client.close()
  await server?.stop()
})

function flood(localAddress: string, refill: boolean): Flood {
  const made = new Flood(server.port, localAddress, refill)
  floods.push(made)
  return made
}

function peer(localAddress: string): PeerClient {
  const client = new PeerClient(server.url, server.key, localAddress)
  clients.push(client)
  return client
}

describe('listeners admit connections per peer and in total', () => {
  it('closes a connection that never sends its headers within the headers timeout', async () => {
    const silent = flood('127.0.0.3', false)
    try {
      await silent.open(20)
      // The bound: the timeout, and the check's interval (a quarter of it, at most 1 s) after it.
      await new Promise((resolve) => setTimeout(resolve, HEADERS_TIMEOUT_MS * 1.25 + 1500))
      expect(silent.held.size).toBe(0)
    } finally {
      silent.stop()
    }
  })

  it('answers a request whose body trickles in past the request timeout 408 request_timeout and closes it', async () => {
    // Headers in time, then a byte of the body every 300 ms: Fastify gave Node no request timeout,
    // so the connection (and what it declared of the body budget) was held for as long as it went on.
    const socket = net.connect({ port: server.port, host: '127.0.0.1', localAddress: '127.0.0.4' })
    socket.on('error', () => undefined)
    let answer = ''
    socket.on('data', (chunk: Buffer) => {
      answer += chunk.toString('latin1')
    })
    const closed = new Promise<boolean>((resolve) => {
      socket.once('close', () => resolve(true))
      // The bound: the timeout, and the check's interval (at most 1 s) after it, with room.
      setTimeout(() => resolve(false), REQUEST_TIMEOUT_MS * 2 + 3000).unref()
    })
    socket.write(
      `PUT /v1/sessions/${session}/files/content?path=trickle HTTP/1.1\r\nHost: cairn.test\r\n` +
        `Authorization: Bearer ${server.key}\r\nContent-Type: application/octet-stream\r\nContent-Length: 1048576\r\n\r\n`,
    )
    const trickle = setInterval(() => socket.writable && socket.write('x'), 300)
    try {
      expect(await closed, `still open after ${REQUEST_TIMEOUT_MS * 2 + 3000} ms`).toBe(true)
      expect(answer).toMatch(/^HTTP\/1\.1 408 /)
      expect(answer).toContain('"code":"request_timeout"')
    } finally {
      clearInterval(trickle)
      socket.destroy()
    }
  })

  it('one peer holding more connections than the descriptor limit stops neither /healthz nor a turn of another peer', async () => {
    const attacker = flood('127.0.0.1', true)
    try {
      await attacker.open(NOFILE + 100)
      const other = peer('127.0.0.2')
      const health = await other.request('GET', '/healthz')
      expect(health.status, health.text).toBe(200)
      const end = await other.turn(session, 'still here')
      expect(end?.type, JSON.stringify(end)).toBe('run.completed')
      // Those over the peer's cap were told why (429 rate_limited) before they were closed.
      expect(attacker.refused).toBeGreaterThan(0)
    } finally {
      attacker.stop()
    }
  })

  it("many peers together never take the runtime's reserve of descriptors: a turn still starts its sandbox", async () => {
    // Connected before the flood: the turn's request does not need a new connection.
    const other = peer('127.0.0.2')
    expect((await other.request('GET', '/healthz')).status).toBe(200)
    // A cold sandbox (the warm one stopped) takes descriptors of the server's own.
    expect((await other.request('POST', `/v1/sessions/${session}/end`)).status).toBe(200)
    const many = Array.from({ length: 12 }, (_, i) => flood(`127.0.1.${i + 1}`, true))
    try {
      await Promise.all(many.map((f) => f.open(PER_PEER)))
      const end = await other.turn(session, 'cold start under siege')
      expect(end?.type, JSON.stringify(end)).toBe('run.completed')
      // Over the total, connections were refused (503 unavailable): the rest is the runtime's.
      expect(many.some((f) => f.refused > 0)).toBe(true)
    } finally {
      for (const f of many) f.stop()
    }
  })
})
