import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { probeGvisor } from '../packages/runtime/src/sandbox/gvisor-driver.js'
import { makeProject } from './helpers/projects.js'
import { type Api, startTestServer, type TestServer } from './helpers/server.js'

/**
 * `POST /v1/sessions/{id}/forks {memory: true, count}`: forks of a session as it is now, whose
 * processes go on from that instant. The agent starts a background process holding a counter in
 * its memory only (and a token it drew at start); each time it is asked it counts one more and
 * writes the new figure to /workspace/counter.txt. A turn reads that file first (the files the
 * turn starts from), then asks the counter.
 *
 * About 20 s: two deploys, and under gVisor a cold start, two checkpoints and five restores,
 * which is what the cases are about; one server for the file.
 */
const COUNTER_AGENT = `
import os, socket, time
SOCK = '/tmp/counter.sock'
if os.fork() == 0:
    server = socket.socket(socket.AF_UNIX)
    server.bind(SOCK)
    server.listen(4)
    count = 0
    token = os.urandom(6).hex()
    while True:
        conn, _ = server.accept()
        count += 1
        with open('/workspace/counter.txt', 'w') as f:
            f.write(str(count))
        conn.sendall(f'{count} {token}'.encode())
        conn.close()

def ask():
    for _ in range(200):
        try:
            conn = socket.socket(socket.AF_UNIX)
            conn.connect(SOCK)
            return conn.recv(100).decode()
        except (FileNotFoundError, ConnectionRefusedError):
            time.sleep(0.05)
    raise SystemExit('the counter process never listened')

while True:
    input()
    try:
        before = open('/workspace/counter.txt').read()
    except FileNotFoundError:
        before = '-'
    count, token = ask().split()
    print(f'before={before} count={count} token={token}')
`

const gvisor = await probeGvisor()
if (!gvisor.ok) console.warn(`fork-memory: gVisor cannot run here, its cases are SKIPPED: ${gvisor.reason}`)

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  for (const [name, extra] of [
    ['fork-counter', 'isolation: gvisor\npause: memory\n'],
    ['fork-counter-bwrap', 'isolation: bwrap\n'],
  ] as const) {
    const project = await makeProject({
      'cairn.yaml': `name: ${name}\ncommand: python3 -u agent.py\n${extra}`,
      'agent.py': COUNTER_AGENT,
    })
    expect((await t.api.deploy(project)).status).toBe(201)
  }
})

afterAll(async () => {
  await t?.close()
})

interface Reply {
  before: string
  count: number
  token: string
  coldStart: boolean
}

async function tick(api: Api, sessionId: string): Promise<Reply> {
  const run = await api.send(sessionId, 'tick')
  expect(run.terminal?.type, JSON.stringify(run.events)).toBe('run.completed')
  const match = /before=(\S+) count=(\d+) token=([0-9a-f]+)/.exec(run.text)
  if (!match?.[1] || !match[2] || !match[3]) throw new Error(`unexpected reply: ${run.text}`)
  const started = run.events.find((e) => e.type === 'run.started')
  return {
    before: match[1],
    count: Number(match[2]),
    token: match[3],
    coldStart: started?.type === 'run.started' && started.coldStart,
  }
}

async function causes(sessionId: string): Promise<string[]> {
  const events: { cause: string }[] = (await t.api.call('GET', `/v1/sessions/${sessionId}/events`)).body.data
  return events.map((e) => e.cause)
}

describe.skipIf(!gvisor.ok)('forks with memory under gVisor', () => {
  it('N forks of a warm session each go on from the fork instant with its files; the parent goes on unaffected', async () => {
    const { id } = await t.api.createSession('fork-counter', { keepWarmMs: 600_000 })
    const first = await tick(t.api, id)
    expect(first).toMatchObject({ before: '-', count: 1, coldStart: true })
    await tick(t.api, id)
    expect(await tick(t.api, id)).toEqual({ ...first, before: '2', count: 3, coldStart: false })

    const res = await t.api.call('POST', `/v1/sessions/${id}/forks`, {
      memory: true,
      count: 2,
      title: 'twin',
    })
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    expect(res.body.memory).toBe(true)
    const forks: { id: string; title: string }[] = res.body.sessions
    expect(forks).toHaveLength(2)
    expect(new Set([id, ...forks.map((f) => f.id)]).size).toBe(3)
    for (const fork of forks) expect(fork.title).toBe('twin')

    // Each fork's background process goes on from 3 with the parent's token, and its workspace is
    // the one of that instant (counter.txt says 3).
    const [a, b] = forks.map((f) => f.id) as [string, string]
    expect(await tick(t.api, a)).toEqual({ ...first, before: '3', count: 4, coldStart: false })
    expect(await tick(t.api, a)).toMatchObject({ before: '4', count: 5, token: first.token })
    // Independently of the other fork: its memory and its files are its own.
    expect(await tick(t.api, b)).toEqual({ ...first, before: '3', count: 4, coldStart: false })
    expect(await causes(b)).toContain('memory_restored')

    // The parent goes on from where it was, on its own.
    expect(await tick(t.api, id)).toEqual({ ...first, before: '3', count: 4, coldStart: false })
    expect(await tick(t.api, id)).toMatchObject({ before: '4', count: 5, token: first.token })
    expect(await tick(t.api, b)).toMatchObject({ before: '4', count: 5, token: first.token })
  })

  it('forks a paused session from its checkpoint', async () => {
    const { id } = await t.api.createSession('fork-counter', { keepWarmMs: 200 })
    const first = await tick(t.api, id)
    await tick(t.api, id)
    for (let i = 0; i < 600 && !(await causes(id)).includes('memory_paused'); i++)
      await new Promise((r) => setTimeout(r, 50))
    expect(await causes(id)).toContain('memory_paused')

    const res = await t.api.call('POST', `/v1/sessions/${id}/forks`, { memory: true })
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    const [fork] = res.body.sessions as { id: string }[]
    expect(await tick(t.api, fork?.id ?? '')).toEqual({ ...first, before: '2', count: 3, coldStart: false })
    expect(await tick(t.api, id)).toEqual({ ...first, before: '2', count: 3, coldStart: false })
  })
})

describe('forks of a session as it is now, without a driver that checkpoints memory', () => {
  it("refuses memory under bwrap with GET /v1/runtime's reason, and makes plain forks", async () => {
    const { id } = await t.api.createSession('fork-counter-bwrap', {})
    const runtime = await t.api.call('GET', '/v1/runtime')
    const bwrap = runtime.body.drivers.find((d: { name: string }) => d.name === 'bwrap')
    const refused = await t.api.call('POST', `/v1/sessions/${id}/forks`, { memory: true, count: 2 })
    expect(refused.status).toBe(400)
    expect(refused.body.error.code).toBe('capability_unavailable')
    expect(refused.body.error.details).toEqual({
      driver: 'bwrap',
      capability: 'memorySnapshot',
      reason: bwrap.capabilityReasons.memorySnapshot,
    })
    // Nothing was made: no snapshot, no fork.
    const snaps: { kind: string }[] = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data
    expect(snaps.filter((s) => s.kind === 'manual')).toEqual([])

    const plain = await t.api.call('POST', `/v1/sessions/${id}/forks`, { count: 2 })
    expect(plain.status, JSON.stringify(plain.body)).toBe(201)
    expect(plain.body).toMatchObject({ memory: false, snapshot: { sessionId: id, kind: 'manual' } })
    const plainIds = plain.body.sessions.map((s: { id: string }) => s.id)
    expect(new Set([id, ...plainIds]).size).toBe(3)

    const tooMany = await t.api.call('POST', `/v1/sessions/${id}/forks`, { count: 17 })
    expect(tooMany.status).toBe(400)
    expect(tooMany.body.error.code).toBe('validation_failed')
  })
})
