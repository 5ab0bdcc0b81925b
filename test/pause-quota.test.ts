import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { probeGvisor } from '../packages/runtime/src/sandbox/gvisor-driver.js'
import { makeProject } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

/**
 * Memory checkpoints count inside the session's storage quota: a counter agent that holds 24 MiB
 * of random (incompressible) bytes in memory cannot be paused with memory under a 16 MiB
 * workspace quota; it stops as with `pause: stop`, the reason in its events. A snapshot's memory
 * counts against the tenant quota (40 MiB: the session's own checkpoint and the snapshot's copy
 * are 48 MiB together).
 */
const BIG_COUNTER_AGENT = `
import os
blob = os.urandom(24 * 1024 * 1024)
token = os.urandom(6).hex()
count = 0
while True:
    input()
    count += 1
    print(f"count={count} token={token} blob={len(blob)}")
`

const gvisor = await probeGvisor()
if (!gvisor.ok) console.warn(`pause-quota: gVisor cannot run here, its cases are SKIPPED: ${gvisor.reason}`)

let t: TestServer

beforeAll(async () => {
  t = await startTestServer({ server: { workspaceQuotaMiB: 16, tenantQuotaMiB: 40, residentPauses: 0 } })
})

afterAll(async () => {
  await t?.close()
})

async function events(sessionId: string): Promise<{ cause: string; detail: string | null }[]> {
  return (await t.api.call('GET', `/v1/sessions/${sessionId}/events`)).body.data
}

async function eventually(sessionId: string, cause: string) {
  for (let i = 0; i < 400; i++) {
    const found = (await events(sessionId)).find((e) => e.cause === cause)
    if (found) return found
    await new Promise((r) => setTimeout(r, 50))
  }
  throw new Error(`no ${cause} event for ${sessionId}: ${JSON.stringify(await events(sessionId))}`)
}

describe.skipIf(!gvisor.ok)('memory checkpoints within the storage quota', () => {
  beforeAll(async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: big-counter\ncommand: python3 -u agent.py\nisolation: gvisor\npause: memory\n',
      'agent.py': BIG_COUNTER_AGENT,
    })
    expect((await t.api.deploy(project)).status).toBe(201)
  })

  it('does not keep a checkpoint over the workspace quota: the session stops, the reason in its events', async () => {
    const { id } = await t.api.createSession('big-counter', { keepWarmMs: 400 })
    const first = await t.api.send(id, 'one')
    expect(first.text).toMatch(/count=1 token=\w+ blob=25165824/)

    const discarded = await eventually(id, 'memory_discarded')
    expect(discarded.detail).toMatch(
      /^memory checkpoint not kept, stopped: quota_exceeded: its \d+ bytes with the workspace's \d+ bytes exceed the workspace quota of 16777216 bytes/,
    )
    expect((await events(id)).some((e) => e.cause === 'memory_paused')).toBe(false)
    expect((await t.api.call('GET', '/v1/usage')).body.memoryCheckpoints).toEqual({ count: 0, bytes: 0 })

    // The next message starts cold, as after a stop.
    const second = await t.api.send(id, 'two')
    expect(second.text).toMatch(/count=1 /)
    const started = second.events.find((e) => e.type === 'run.started')
    expect(started?.type === 'run.started' && started.coldStart).toBe(true)
  })

  it('refuses a snapshot with memory over the tenant quota (quota_exceeded); the session goes on where it was', async () => {
    const { id } = await t.api.createSession('big-counter', { keepWarmMs: 600_000 })
    const first = await t.api.send(id, 'one')
    const token = /token=(\w+)/.exec(first.text)?.[1]
    expect(token).toBeDefined()
    const res = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, { memory: true })
    expect(res.status, JSON.stringify(res.body)).toBe(507)
    expect(res.body.error.code).toBe('quota_exceeded')
    expect(res.body.error.message).toMatch(
      /^the snapshot's memory was not kept: its \d+ bytes with the tenant's \d+ bytes exceed the tenant quota of 41943040 bytes/,
    )
    const snaps: { kind: string }[] = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data
    expect(snaps.filter((s) => s.kind === 'manual')).toEqual([])
    const second = await t.api.send(id, 'two')
    expect(second.text).toContain(`count=2 token=${token}`)
  })
})
