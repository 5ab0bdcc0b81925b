import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { probeGvisor } from '../packages/runtime/src/sandbox/gvisor-driver.js'
import { makeProject } from './helpers/projects.js'
import { type Api, startTestServer, type TestServer } from './helpers/server.js'

/**
 * `POST /v1/sessions/{id}/snapshots {memory: true}`: a snapshot that also keeps the running
 * sandbox's memory; a fork from it starts from that running state. The counter and the token it
 * drew at start live only in the agent's memory.
 */
const COUNTER_AGENT = `
import os
count = 0
token = os.urandom(6).hex()
while True:
    line = input()
    count += 1
    print(f"count={count} token={token}")
`

const gvisor = await probeGvisor()
if (!gvisor.ok) console.warn(`pause-fork: gVisor cannot run here, its cases are SKIPPED: ${gvisor.reason}`)

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
})

afterAll(async () => {
  await t?.close()
})

interface Reply {
  count: number
  token: string
  coldStart: boolean
}

async function ask(api: Api, sessionId: string, prompt: string): Promise<Reply> {
  const run = await api.send(sessionId, prompt)
  expect(run.terminal?.type, JSON.stringify(run.events)).toBe('run.completed')
  const match = /count=(\d+) token=([0-9a-f]+)/.exec(run.text)
  if (!match?.[1] || !match[2]) throw new Error(`unexpected reply: ${run.text}`)
  const started = run.events.find((e) => e.type === 'run.started')
  return {
    count: Number(match[1]),
    token: match[2],
    coldStart: started?.type === 'run.started' && started.coldStart,
  }
}

async function events(sessionId: string): Promise<{ cause: string; detail: string | null }[]> {
  return (await t.api.call('GET', `/v1/sessions/${sessionId}/events`)).body.data
}

describe.skipIf(!gvisor.ok)('snapshots with memory under gVisor', () => {
  beforeAll(async () => {
    for (const [name, extra] of [
      ['mem-counter', 'isolation: gvisor\npause: memory\n'],
      ['mem-counter-bwrap', 'isolation: bwrap\n'],
      ['mem-counter-stop', 'isolation: gvisor\n'],
    ] as const) {
      const project = await makeProject({
        'cairn.yaml': `name: ${name}\ncommand: python3 -u agent.py\n${extra}`,
        'agent.py': COUNTER_AGENT,
      })
      expect((await t.api.deploy(project)).status).toBe(201)
    }
  })

  it('a fork of a snapshot with memory starts from the running state; the source goes on independently', async () => {
    // Kept warm for the whole test: only the snapshot checkpoints the sandbox.
    const { id } = await t.api.createSession('mem-counter', { keepWarmMs: 600_000 })
    const first = await ask(t.api, id, 'one')
    expect(first).toMatchObject({ count: 1, coldStart: true })
    await ask(t.api, id, 'two')
    expect(await ask(t.api, id, 'three')).toEqual({ ...first, count: 3, coldStart: false })

    const snap = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, { memory: true, label: 'at three' })
    expect(snap.status, JSON.stringify(snap.body)).toBe(201)
    const fork = await t.api.call('POST', `/v1/sessions/${id}/fork`, { snapshotId: snap.body.id })
    expect(fork.status, JSON.stringify(fork.body)).toBe(201)
    const childId: string = fork.body.id

    // The fork's first message restores the checkpoint: count 4, the same token.
    const forked = await ask(t.api, childId, 'four')
    expect(forked).toMatchObject({ count: 4, token: first.token, coldStart: false })
    const restored = (await events(childId)).find((e) => e.cause === 'memory_restored')
    expect(restored?.detail).toContain(`restored from the memory of snapshot ${snap.body.id}`)

    // The source goes on from where it was, on its own: its 4 is not the fork's 5.
    expect(await ask(t.api, childId, 'five')).toMatchObject({ count: 5, token: first.token })
    expect(await ask(t.api, id, 'four')).toEqual({ ...first, count: 4, coldStart: false })
    expect(await ask(t.api, id, 'five')).toMatchObject({ count: 5, token: first.token })
  })

  it('refuses memory where no sandbox runs, under a driver that cannot, and for a sandbox not made to be checkpointed', async () => {
    const idle = await t.api.createSession('mem-counter', {})
    const none = await t.api.call('POST', `/v1/sessions/${idle.id}/snapshots`, { memory: true })
    expect(none.status).toBe(409)
    expect(none.body.error.code).toBe('sandbox_not_running')
    expect(none.body.error.message).toMatch(/has no running sandbox/)

    const bwrap = await t.api.createSession('mem-counter-bwrap', {})
    const refused = await t.api.call('POST', `/v1/sessions/${bwrap.id}/snapshots`, { memory: true })
    expect(refused.status).toBe(400)
    expect(refused.body.error.details).toMatchObject({ driver: 'bwrap', capability: 'memorySnapshot' })
    expect(refused.body.error.details.reason).toMatch(/CRIU/)

    const stop = await t.api.createSession('mem-counter-stop', { keepWarmMs: 600_000 })
    await ask(t.api, stop.id, 'one')
    const notCheckpointable = await t.api.call('POST', `/v1/sessions/${stop.id}/snapshots`, { memory: true })
    expect(notCheckpointable.status).toBe(400)
    expect(notCheckpointable.body.error.message).toMatch(/only a pause: memory session's sandbox can/)

    // No snapshot was left behind by a refusal.
    for (const id of [idle.id, bwrap.id, stop.id]) {
      const snaps: { kind: string }[] = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data
      expect(snaps.filter((s) => s.kind === 'manual')).toEqual([])
    }
  })
})
