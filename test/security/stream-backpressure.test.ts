import http from 'node:http'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { Api, packDir } from '../helpers/server.js'
import { rssMiB, type ServerProcess, startServerProcess } from '../helpers/server-process.js'

// The server runs in its own process, so that its resident memory (/proc/<pid>/status) is its own.
/** How much the server's memory may grow while an agent floods a slow client (it grew by GiBs). */
const RSS_GROWTH_BOUND_MIB = 128
const STALL_MS = 3000
const FLOOD_MS = 8000

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

/** A turn's stream whose client reads `bytesPerSecond` (0: nothing); `closed` settles when the server ends it. */
function slowTurn(sessionId: string, bytesPerSecond: number) {
  let received = 0
  let timer: NodeJS.Timeout | undefined
  let response: http.IncomingMessage | undefined
  const request = http.request(`${server.url}/v1/sessions/${sessionId}/messages`, {
    method: 'POST',
    headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
  })
  const closed = new Promise<void>((resolve) => {
    request.on('error', () => resolve())
    request.on('response', (res) => {
      response = res
      res.pause()
      res.on('error', () => resolve())
      res.on('close', () => resolve())
      if (bytesPerSecond > 0)
        timer = setInterval(() => {
          received += res.read(Math.max(1, bytesPerSecond / 10))?.length ?? 0
        }, 100)
    })
  })
  request.end(JSON.stringify({ prompt: 'flood' }))
  return {
    closed: closed.finally(() => clearInterval(timer)),
    get received() {
      return received
    },
    readAll() {
      response?.resume()
    },
    stop() {
      clearInterval(timer)
      request.destroy()
    },
  }
}

/** The highest resident memory of the server while `ms` pass (sampled every 200 ms). */
async function peakRss(ms: number): Promise<number> {
  let peak = 0
  for (const until = Date.now() + ms; Date.now() < until; ) {
    peak = Math.max(peak, rssMiB(server.child.pid ?? 0))
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
  return peak
}

describe("a turn's stream is held to its client's pace", () => {
  it('an agent flooding a client that reads 40 KiB/s leaves the server within its memory bound, and another session’s turn completes', async () => {
    const flooded = await api.createSession('flooder')
    const other = await api.createSession('echo')
    expect((await api.send(other.id, 'warm up')).terminal?.type).toBe('run.completed')
    const before = rssMiB(server.child.pid ?? 0)
    const client = slowTurn(flooded.id, 40 * 1024)
    try {
      const peak = peakRss(FLOOD_MS)
      const meanwhile = await api.send(other.id, 'still served')
      expect(meanwhile.terminal?.type, JSON.stringify(meanwhile.terminal)).toBe('run.completed')
      const growth = (await peak) - before
      console.log(`server RSS ${before.toFixed(0)} MiB before, grew by ${growth.toFixed(0)} MiB at most`)
      expect(growth, `the server grew by ${growth.toFixed(0)} MiB`).toBeLessThan(RSS_GROWTH_BOUND_MIB)
      expect(client.received).toBeGreaterThan(0)
    } finally {
      client.stop()
      expect((await api.call('POST', `/v1/sessions/${flooded.id}/cancel`)).status).toBe(200)
    }
  })

  it('a client that reads nothing is cut after the stall bound, and the turn goes on until cancelled', async () => {
    const flooded = await api.createSession('flooder')
    const before = rssMiB(server.child.pid ?? 0)
    const client = slowTurn(flooded.id, 0)
    try {
      const peak = peakRss(STALL_MS + 3000)
      // Past the stall bound (and a margin for the first events to fill the socket), the client
      // reads again: what the kernel held for it, then the end of a connection cut by the server.
      await new Promise((resolve) => setTimeout(resolve, STALL_MS + 2000))
      client.readAll()
      const cut = await Promise.race([
        client.closed.then(() => true),
        new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 10_000)),
      ])
      expect(cut, 'the server cut the stream of a client that read nothing').toBe(true)
      const growth = (await peak) - before
      console.log(`server RSS ${before.toFixed(0)} MiB before, grew by ${growth.toFixed(0)} MiB at most`)
      expect(growth, `the server grew by ${growth.toFixed(0)} MiB`).toBeLessThan(RSS_GROWTH_BOUND_MIB)
      const session = await api.call('GET', `/v1/sessions/${flooded.id}`)
      expect(session.body.status).toBe('active')
    } finally {
      client.stop()
      expect((await api.call('POST', `/v1/sessions/${flooded.id}/cancel`)).status).toBe(200)
    }
  })
})
