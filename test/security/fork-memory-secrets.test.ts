import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { probeGvisor } from '../../packages/runtime/src/sandbox/gvisor-driver.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

/**
 * A fork with memory carries the secrets its parent's sandbox was started with. One that has
 * expired since must not reach a new session that way: an expired secret is never handed to a new
 * sandbox. The agent prints its secret reversed (redaction would hide it as written) and a counter
 * that lives in its memory only.
 *
 * About 15-25 s on a loaded machine: a deploy, two gVisor cold starts, the secret's 2.5 s of life,
 * a checkpoint and a restore.
 */
const AGENT = `
import os
count = 0
while True:
    input()
    count += 1
    print(f"count={count} secret={os.environ.get('TOKEN', '-')[::-1]}")
`
const VALUE = 'expiring-token-7f3a9c'
const REVERSED = [...VALUE].reverse().join('')

const gvisor = await probeGvisor()
if (!gvisor.ok) console.warn(`fork-memory-secrets: gVisor cannot run here, SKIPPED: ${gvisor.reason}`)

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
})

afterAll(async () => {
  await t?.close()
})

async function ask(sessionId: string): Promise<string> {
  const run = await t.api.send(sessionId, 'go')
  expect(run.terminal?.type, JSON.stringify(run.events)).toBe('run.completed')
  return run.text.trim()
}

describe.skipIf(!gvisor.ok)('forks with memory and expired secrets', () => {
  it("refuses to hand on a sandbox's memory that holds a secret expired since; forks once the sandbox is replaced", async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: fork-secret\ncommand: python3 -u agent.py\nisolation: gvisor\npause: memory\n',
      'agent.py': AGENT,
    })
    const deployed = await t.api.deploy(project)
    expect(deployed.status).toBe(201)
    const expiresAtMs = Date.now() + 2500
    const set = await t.api.call('PUT', `/v1/agents/${deployed.body.agent.id}/secrets`, {
      secrets: { TOKEN: VALUE },
      expiresAt: new Date(expiresAtMs).toISOString(),
    })
    expect(set.status, JSON.stringify(set.body)).toBe(200)

    const { id } = await t.api.createSession('fork-secret', { keepWarmMs: 600_000 })
    expect(await ask(id)).toBe(`count=1 secret=${REVERSED}`)
    await new Promise((r) => setTimeout(r, Math.max(0, expiresAtMs - Date.now()) + 200))

    for (const [route, body] of [
      ['forks', { memory: true, count: 2 }],
      ['snapshots', { memory: true }],
    ] as const) {
      const refused = await t.api.call('POST', `/v1/sessions/${id}/${route}`, body)
      expect(refused.status, JSON.stringify(refused.body)).toBe(409)
      expect(refused.body.error).toMatchObject({ code: 'conflict', details: { reason: 'secret_expired' } })
    }
    const snaps: { kind: string }[] = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data
    expect(snaps.filter((s) => s.kind === 'manual')).toEqual([])

    // The next message replaces the sandbox without the secret; its memory can be forked then.
    expect(await ask(id)).toBe('count=1 secret=-')
    const forked = await t.api.call('POST', `/v1/sessions/${id}/forks`, { memory: true })
    expect(forked.status, JSON.stringify(forked.body)).toBe(201)
    expect(await ask(forked.body.sessions[0].id)).toBe('count=2 secret=-')
  })
})
