import { existsSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

const servers: TestServer[] = []
const dirs: string[] = []

afterAll(async () => {
  for (const s of servers) await s.close().catch(() => undefined)
  for (const d of dirs) await rm(d, { recursive: true, force: true })
})

async function slowAgent(t: TestServer) {
  const project = await makeProject({
    'cairn.yaml': 'name: slow\ncommand: python3 slow.py\n',
    'slow.py':
      'import time\nwhile True:\n    line = input()\n    time.sleep(0.8)\n    open("done.txt", "a").write(line + "\\n")\n    print("done " + line)\n',
  })
  expect((await t.api.deploy(project)).status).toBe(201)
}

describe('durability', () => {
  it('a lease keeps an idle session from timing out', async () => {
    const t = await startTestServer()
    servers.push(t)
    await slowAgent(t)
    const leased = await t.api.createSession('slow', { idleTimeoutMs: 1000 })
    const plain = await t.api.createSession('slow', { idleTimeoutMs: 1000 })
    const lease = await t.api.call('POST', `/v1/sessions/${leased.id}/lease`, { ttlMs: 60_000 })
    expect(lease.status).toBe(200)
    expect(Date.parse(lease.body.leaseUntil)).toBeGreaterThan(Date.now() + 50_000)
    await new Promise((r) => setTimeout(r, 1100))
    await t.server.sessions.reap()
    expect((await t.api.call('GET', `/v1/sessions/${leased.id}`)).body.status).toBe('idle')
    expect((await t.api.call('GET', `/v1/sessions/${plain.id}`)).body).toMatchObject({
      status: 'timeout',
      statusCause: 'idle_timeout',
    })
    expect((await t.api.call('POST', `/v1/sessions/${leased.id}/lease`, { ttlMs: 5 })).status).toBe(400)
  })

  it('a graceful stop lets a running turn finish, and a restart finds every session where it was', async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-drain-'))
    dirs.push(dataDir)
    const first = await startTestServer({ dataDir })
    await slowAgent(first)
    const session = await first.api.createSession('slow')
    const running = first.api.send(session.id, 'last words')
    await new Promise((r) => setTimeout(r, 200))
    await first.close()
    const result = await running
    expect(result.terminal?.type).toBe('run.completed')
    expect(result.text).toBe('done last words\n')

    const second = await startTestServer({ dataDir })
    servers.push(second)
    second.api = new (await import('./helpers/server.js')).Api(second.url, first.key)
    const info = await second.api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body).toMatchObject({ status: 'idle', turnCount: 1 })
    expect((await second.api.send(session.id, 'again')).text).toBe('done again\n')
  })

  it('checks the pool against the database at start: a lost workspace is reported, orphans are removed', async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-reconcile-'))
    dirs.push(dataDir)
    const first = await startTestServer({ dataDir })
    await slowAgent(first)
    const kept = await first.api.createSession('slow')
    const lost = await first.api.createSession('slow')
    const pool = first.server.runtime.pool
    await pool.ops.delete(pool.workspacePath(lost.id))
    const orphan = pool.workspacePath('ses_orphan00000000000000')
    await pool.ops.create(orphan)
    await first.close()

    const second = await startTestServer({ dataDir })
    servers.push(second)
    const api = new (await import('./helpers/server.js')).Api(second.url, first.key)
    expect((await api.call('GET', `/v1/sessions/${kept.id}`)).body.status).toBe('idle')
    expect((await api.call('GET', `/v1/sessions/${lost.id}`)).body).toMatchObject({
      status: 'failed',
      statusCause: 'state_lost',
    })
    const resumed = await api.call('POST', `/v1/sessions/${lost.id}/resume`)
    expect(resumed.status).toBe(500)
    expect(resumed.body.error.code).toBe('state_lost')
    expect(existsSync(second.server.runtime.pool.workspacePath('ses_orphan00000000000000'))).toBe(false)
  })
})
