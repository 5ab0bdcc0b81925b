import { randomBytes } from 'node:crypto'
import net from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import WebSocket from 'ws'
import { makeProject } from '../helpers/projects.js'
import { Api, packDir } from '../helpers/server.js'
import { rssMiB, type ServerProcess, startServerProcess } from '../helpers/server-process.js'
import { FLOOD_RSS_GROWTH_BOUND_MIB, peakRss, slowTurn } from '../helpers/slow-client.js'

// The server runs in its own process, so that its resident memory (/proc/<pid>/status) is its own.
/**
 * How much higher the flood's last third may take the server than its middle one: a server that
 * keeps the flood grows with it (~38 MiB/s: ~125 MiB a third), a bounded one levels off (its
 * garbage comes and goes).
 */
const LEVEL_GROWTH_BOUND_MIB = 48
const STALL_MS = 3000
/** Stdin a terminal client sends in one go, and how much of it the server may hold at once (with its garbage). */
const TERMINAL_FLOOD_MIB = 192
const TERMINAL_INPUT_GROWTH_BOUND_MIB = 96
const FLOOD_MS = 12_000

/** A jsonl agent that answers every message with tool frames, as fast as it can, and never ends. */
const FLOODER = {
  'cairn.yaml': 'name: flooder\ncommand: python3 flood.py\nprotocol: jsonl\n',
  'flood.py': [
    'import json, sys',
    'frame = json.dumps({"type": "tool.start", "id": "t", "name": "flood", "input": {"pad": "x" * 4000}}) + "\\n"',
    'chunk = frame * 50',
    'for line in sys.stdin:',
    '    while True:',
    '        sys.stdout.write(chunk)',
  ].join('\n'),
}

let server: ServerProcess
let api: Api

beforeAll(async () => {
  server = await startServerProcess({ spareLaunchers: 0, sseStallMs: STALL_MS })
  api = new Api(server.url, server.key)
  for (const files of [
    FLOODER,
    {
      'cairn.yaml': 'name: echo\ncommand: python3 echo.py\n',
      'echo.py': 'while True:\n    print("echo", input())\n',
    },
  ])
    expect((await api.call('POST', '/v1/agents', await packDir(await makeProject(files)))).status).toBe(201)
}, 120_000)

afterAll(async () => {
  await server?.stop()
})

describe("a turn's stream is held to its client's pace", () => {
  // At 40 KiB/s the client frees less of its socket's kernel buffers (MiBs on loopback) within
  // STALL_MS than the kernel waits for before it reports the socket writable again, so the server
  // cuts it after STALL_MS: the flood's rest runs with no client, at the database's pace (~5,000
  // events of 4 KiB a second here). While a turn held up to 1 MiB of events unwritten, that rate
  // had them promoted to V8's old space before their batch was written, and the garbage took the
  // server up by 107–150 MiB here before a full collection (139 MiB on CI).
  it('an agent flooding a client that reads 40 KiB/s (then none) takes the server to a level within its memory bound, and another session’s turn completes', async () => {
    const flooded = await api.createSession('flooder')
    const other = await api.createSession('echo')
    expect((await api.send(other.id, 'warm up')).terminal?.type).toBe('run.completed')
    const before = rssMiB(server.child.pid ?? 0)
    const client = slowTurn(server, flooded.id, 40 * 1024)
    try {
      const peaks = peakRss(server.child.pid ?? 0, FLOOD_MS, 3)
      const meanwhile = await api.send(other.id, 'still served')
      expect(meanwhile.terminal?.type, JSON.stringify(meanwhile.terminal)).toBe('run.completed')
      // The last two thirds are past the cut (at STALL_MS and a little): the middle one's peak is the level of a flood with no
      // client, which the last one's must not pass by more than LEVEL_GROWTH_BOUND_MIB.
      const [first, middle, last] = (await peaks).map((peak) => peak - before) as [number, number, number]
      const most = Math.max(first, middle, last)
      console.log(
        `server RSS ${before.toFixed(0)} MiB before, grew by ${first.toFixed(0)}, ${middle.toFixed(0)} and ${last.toFixed(0)} MiB at most in the flood's thirds`,
      )
      expect(most, `the server grew by ${most.toFixed(0)} MiB`).toBeLessThan(FLOOD_RSS_GROWTH_BOUND_MIB)
      expect(last - middle, "the server's growth did not level off").toBeLessThan(LEVEL_GROWTH_BOUND_MIB)
      expect(client.received).toBeGreaterThan(0)
    } finally {
      client.stop()
      expect((await api.call('POST', `/v1/sessions/${flooded.id}/cancel`)).status).toBe(200)
    }
  })

  it('a client that reads nothing is cut after the stall bound, and the turn goes on until cancelled', async () => {
    const flooded = await api.createSession('flooder')
    const before = rssMiB(server.child.pid ?? 0)
    const client = slowTurn(server, flooded.id, 0)
    try {
      const peaks = peakRss(server.child.pid ?? 0, STALL_MS + 3000)
      // Past the stall bound (and a margin for the first events to fill the socket), the client
      // reads again: what the kernel held for it, then the end of a connection cut by the server.
      await new Promise((resolve) => setTimeout(resolve, STALL_MS + 2000))
      client.readAll()
      const cut = await Promise.race([
        client.closed.then(() => true),
        new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 10_000)),
      ])
      expect(cut, 'the server cut the stream of a client that read nothing').toBe(true)
      const growth = Math.max(...(await peaks)) - before
      console.log(`server RSS ${before.toFixed(0)} MiB before, grew by ${growth.toFixed(0)} MiB at most`)
      expect(growth, `the server grew by ${growth.toFixed(0)} MiB`).toBeLessThan(FLOOD_RSS_GROWTH_BOUND_MIB)
      const session = await api.call('GET', `/v1/sessions/${flooded.id}`)
      expect(session.body.status).toBe('active')
    } finally {
      client.stop()
      expect((await api.call('POST', `/v1/sessions/${flooded.id}/cancel`)).status).toBe(200)
    }
  })
})

describe("a terminal's socket is held to its client's pace", () => {
  it("a terminal client that types faster than its command takes it is read at the command's pace: the server grows within its bound", async () => {
    // Each message was taken off the socket at once and queued for its turn through the database
    // and the node, with no bound: a client sending 1 MiB messages faster than they were written
    // to the command's stdin kept every one of them in the server's memory.
    const { id } = await api.createSession('echo')
    const started = await api.call('POST', `/v1/sessions/${id}/commands`, {
      command: ['sh', '-c', 'cat > /dev/null'],
      stdin: true,
      timeoutMs: 120_000,
    })
    expect(started.status, JSON.stringify(started.body)).toBe(201)
    const ws = new WebSocket(
      `${server.url.replace(/^http/, 'ws')}/v1/sessions/${id}/commands/${started.body.id}/terminal`,
      { headers: { authorization: `Bearer ${server.key}` } },
    )
    const errors: string[] = []
    let probed = () => {}
    const answered = new Promise<void>((resolve) => {
      probed = resolve
    })
    ws.on('message', (data, binary) => {
      if (binary) return
      const text = data.toString()
      if (text.includes('flood-done')) probed()
      else errors.push(text)
    })
    await new Promise((resolve, reject) => {
      ws.once('open', resolve)
      ws.once('error', reject)
    })
    const pid = server.child.pid ?? 0
    const before = rssMiB(pid)
    let peak = before
    let flooding = true
    const sampler = (async () => {
      while (flooding) {
        peak = Math.max(peak, rssMiB(pid))
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
    })()
    try {
      // Messages of 1 MiB (the most one may carry), at most 8 in the client's own buffers.
      const chunk = Buffer.alloc(1024 * 1024, 0x61)
      let inFlight = 0
      for (let i = 0; i < TERMINAL_FLOOD_MIB; i++) {
        while (inFlight >= 8) await new Promise((resolve) => setTimeout(resolve, 1))
        inFlight++
        ws.send(chunk, { binary: true }, () => inFlight--)
      }
      // Messages are taken in order: the answer to this text comes once every one before it is.
      ws.send('flood-done')
      await answered
      expect(errors).toEqual([])
    } finally {
      flooding = false
      await sampler
      ws.terminate()
      await api.call('POST', `/v1/sessions/${id}/commands/${started.body.id}/signal`, { signal: 'SIGKILL' })
    }
    const growth = peak - before
    console.log(
      `server RSS ${before.toFixed(0)} MiB before ${TERMINAL_FLOOD_MIB} MiB of stdin, grew by ${growth.toFixed(0)} MiB at most`,
    )
    expect(growth, `the server grew by ${growth.toFixed(0)} MiB`).toBeLessThan(
      TERMINAL_INPUT_GROWTH_BOUND_MIB,
    )
  })

  it('a terminal client that reads nothing is cut after the stall bound; the command runs on', async () => {
    // Its output waited on a socket that took nothing, for ever: the bridge held the connection
    // and its read loop as long as the client stayed connected without reading.
    const { id } = await api.createSession('echo')
    const flood = 'while :; do head -c 1048576 /dev/zero; sleep 0.05; done'
    const started = await api.call('POST', `/v1/sessions/${id}/commands`, {
      command: ['sh', '-c', flood],
      timeoutMs: 120_000,
    })
    expect(started.status, JSON.stringify(started.body)).toBe(201)
    const url = new URL(server.url)
    const socket = net.connect(Number(url.port), url.hostname)
    const closed = new Promise<boolean>((resolve) => socket.once('close', () => resolve(true)))
    socket.on('error', () => undefined)
    socket.write(
      [
        `GET /v1/sessions/${id}/commands/${started.body.id}/terminal HTTP/1.1`,
        `Host: ${url.host}`,
        'Upgrade: websocket',
        'Connection: Upgrade',
        `Sec-WebSocket-Key: ${randomBytes(16).toString('base64')}`,
        'Sec-WebSocket-Version: 13',
        `Authorization: Bearer ${server.key}`,
        '',
        '',
      ].join('\r\n'),
    )
    socket.pause()
    try {
      await new Promise((resolve) => setTimeout(resolve, STALL_MS + 3000))
      socket.resume()
      const cut = await Promise.race([
        closed,
        new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 10_000)),
      ])
      expect(cut, 'the server cut the terminal of a client that read nothing').toBe(true)
      const command = await api.call('GET', `/v1/sessions/${id}/commands/${started.body.id}`)
      expect(command.body.status).toBe('running')
    } finally {
      socket.destroy()
      await api.call('POST', `/v1/sessions/${id}/commands/${started.body.id}/signal`, { signal: 'SIGKILL' })
    }
  })
})
