import { existsSync } from 'node:fs'
import { gunzipSync } from 'node:zlib'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { closeOwned } from './helpers/pool-owners.js'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer

beforeAll(async () => {
  t = await startTestServer({ server: { workspaceQuotaMiB: 16 } })
  const shell = await makeProject(SHELL_PROJECT)
  expect((await t.api.deploy(shell)).status).toBe(201)
})

afterAll(async () => {
  await closeOwned(t)
})

describe('quotas, retention and usage', () => {
  it('stops a workspace at its quota inside the sandbox, and other sessions are unaffected', async () => {
    const greedy = await t.api.createSession('shell', { autoSnapshots: false })
    const modest = await t.api.createSession('shell', { autoSnapshots: false })
    const fill = await t.api.send(
      greedy.id,
      'dd if=/dev/urandom of=big bs=1M count=64 2>&1; sync; stat -c "size=%s" big',
    )
    expect(fill.text).toMatch(/quota exceeded|No space left/i)
    expect(Number(/size=(\d+)/.exec(fill.text)?.[1])).toBeLessThanOrEqual(16 * 1024 * 1024)
    const small = await t.api.send(modest.id, 'dd if=/dev/zero of=ok bs=1M count=4 2>&1 | tail -1')
    expect(small.text).toContain('4194304 bytes')
    expect((await t.api.send(greedy.id, 'rm big && echo freed')).text).toContain('freed')
  })

  it('keeps the last N automatic snapshots, and reports usage', async () => {
    expect((await t.api.call('PUT', '/v1/retention', { keepAutoSnapshots: 3 })).body.keepAutoSnapshots).toBe(
      3,
    )
    const session = await t.api.createSession('shell')
    for (let i = 0; i < 6; i++) await t.api.send(session.id, `echo ${i} >> log`)
    await new Promise((r) => setTimeout(r, 300))
    const snaps = (await t.api.call('GET', `/v1/sessions/${session.id}/snapshots`)).body.data
    expect(snaps.filter((s: { kind: string }) => s.kind === 'auto').length).toBeLessThanOrEqual(4)
    const usage = await t.api.call('GET', '/v1/usage?storage=true')
    expect(usage.body.sessions.total).toBeGreaterThanOrEqual(3)
    expect(usage.body.pool.totalBytes).toBeGreaterThan(0)
    expect(usage.body.storage.find((s: { sessionId: string }) => s.sessionId === session.id)).toBeTruthy()
  })

  it('applies TTLs to ended sessions and records the bytes freed', async () => {
    // Without snapshots the data is the workspace's alone, so deleting it frees all of it.
    const session = await t.api.createSession('shell', { autoSnapshots: false })
    await t.api.send(session.id, 'head -c 2000000 /dev/urandom > data.bin && sync')
    await t.api.call('POST', `/v1/sessions/${session.id}/snapshots`, { label: 'manual' })
    await t.api.send(session.id, 'rm data.bin && head -c 3000000 /dev/urandom > other.bin && sync')
    await t.api.call('POST', `/v1/sessions/${session.id}/end`)
    const snaps = (await t.api.call('GET', `/v1/sessions/${session.id}/snapshots`)).body.data as {
      id: string
    }[]
    expect(snaps.length).toBeGreaterThan(0)
    await t.api.call('PUT', '/v1/retention', { endedWorkspaceTtlMs: 0 })
    const applied = await t.server.retention.apply()
    expect(applied.workspaces).toBeGreaterThanOrEqual(1)
    const info = await t.api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body).toMatchObject({ status: 'deleted', statusCause: 'retention' })
    expect(existsSync(t.server.runtime.pool.workspacePath(session.id))).toBe(false)
    for (const s of snaps) expect(existsSync(t.server.runtime.pool.snapshotPath(s.id))).toBe(false)
    const usage = await t.api.call('GET', '/v1/usage')
    expect(usage.body.retention.deletedWorkspaces).toBeGreaterThanOrEqual(1)
    expect(usage.body.retention.bytesFreed).toBeGreaterThan(4_000_000)
    await t.api.call('PUT', '/v1/retention', { endedWorkspaceTtlMs: null })
  })

  it('keeps an ended session when a TTL is null ("keep"), and refuses a TTL of the wrong type without changing the policy', async () => {
    const session = await t.api.createSession('shell')
    expect((await t.api.send(session.id, 'echo kept > kept.txt && echo ok')).text).toContain('ok')
    // null is the documented "keep"; a coercing validator stored it as 0: deleted at the next pass.
    const keep = { endedSnapshotTtlMs: null, endedWorkspaceTtlMs: null }
    const put = await t.api.call('PUT', '/v1/retention', keep)
    expect(put.status, JSON.stringify(put.body)).toBe(200)
    expect(put.body).toMatchObject(keep)
    for (const wrong of [false, '', '0', [0], {}]) {
      const res = await t.api.call('PUT', '/v1/retention', { endedWorkspaceTtlMs: wrong })
      expect(res.status, JSON.stringify(wrong)).toBe(400)
      expect(res.body.error.code).toBe('validation_failed')
      expect(res.body.error.message).toBe('body/endedWorkspaceTtlMs must be integer or null')
    }
    expect((await t.api.call('GET', '/v1/retention')).body).toMatchObject(keep)
    expect((await t.api.call('POST', `/v1/sessions/${session.id}/end`)).body.status).toBe('completed')
    const applied = await t.server.retention.apply()
    expect(applied).toMatchObject({ workspaces: 0, snapshots: 0 })
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body.status).toBe('completed')
    expect(existsSync(t.server.runtime.pool.workspacePath(session.id))).toBe(true)
    const file = await t.api.call('GET', `/v1/sessions/${session.id}/files/content?path=kept.txt`)
    expect(file.body).toBe('kept\n')
    expect(
      (await t.api.call('GET', `/v1/sessions/${session.id}/snapshots`)).body.data.length,
    ).toBeGreaterThan(0)
  })

  it('never pulls a snapshot out from under a restore: the restore succeeds or says the snapshot is gone', async () => {
    expect((await t.api.call('PUT', '/v1/retention', { keepAutoSnapshots: 1 })).status).toBe(200)
    const session = await t.api.createSession('shell')
    const seen = new Map<string, number>()
    for (let i = 0; i < 25; i++) {
      await t.api.send(session.id, `echo ${i} >> log`)
      // Right after the turn, the pruning of older automatic snapshots runs beside this restore.
      const snaps = (await t.api.call('GET', `/v1/sessions/${session.id}/snapshots`)).body.data as {
        id: string
        kind: string
      }[]
      const oldest = snaps.find((s) => s.kind === 'auto')
      if (!oldest) continue
      const res = await t.api.call('POST', `/v1/sessions/${session.id}/restore`, { snapshotId: oldest.id })
      const key = `${res.status} ${res.body?.error?.code ?? ''}`
      seen.set(key, (seen.get(key) ?? 0) + 1)
    }
    console.log(`[retention] restores beside pruning: ${JSON.stringify(Object.fromEntries(seen))}`)
    for (const key of seen.keys()) expect(['200 ', '404 not_found']).toContain(key)
    // The snapshot retention kept restores, and the session goes on.
    const kept = (await t.api.call('GET', `/v1/sessions/${session.id}/snapshots`)).body.data as {
      id: string
    }[]
    expect(kept.length).toBeGreaterThan(0)
    const last = kept[kept.length - 1]?.id
    expect(
      (await t.api.call('POST', `/v1/sessions/${session.id}/restore`, { snapshotId: last })).status,
    ).toBe(200)
    expect((await t.api.send(session.id, 'echo still here')).text).toContain('still here')
  })

  it('never pulls a snapshot out from under its export: the archive holds every file', async () => {
    expect((await t.api.call('PUT', '/v1/retention', { keepAutoSnapshots: 1 })).status).toBe(200)
    const session = await t.api.createSession('shell')
    // Incompressible, and more than the sockets buffer: the export waits for its reader.
    await t.api.send(
      session.id,
      'mkdir d && for i in $(seq 1 1500); do head -c 4000 /dev/urandom > d/f$i; done',
    )
    // The turn's own snapshot (taken after its answer) is the one exported.
    let source = ''
    for (let i = 0; i < 100 && !source; i++) {
      const snaps = (await t.api.call('GET', `/v1/sessions/${session.id}/snapshots`)).body.data as {
        id: string
        kind: string
        turn: number
      }[]
      source = snaps.find((s) => s.kind === 'auto' && s.turn === 1)?.id ?? ''
      if (!source) await new Promise((r) => setTimeout(r, 50))
    }
    const res = await fetch(`${t.url}/v1/sessions/${session.id}/export?snapshot=${source}`, {
      headers: { authorization: `Bearer ${t.key}` },
    })
    expect(res.status).toBe(200)
    const reader = (res.body as ReadableStream<Uint8Array>).getReader()
    const chunks: Uint8Array[] = []
    const first = await reader.read()
    if (first.value) chunks.push(first.value)
    // The next turn's snapshot makes the exported one expire (keep 1) while it is being read.
    await t.api.send(session.id, 'echo more >> log')
    const path = t.server.runtime.pool.snapshotPath(source)
    for (let i = 0; i < 50 && existsSync(path); i++) await new Promise((r) => setTimeout(r, 100))
    for (;;) {
      const next = await reader.read()
      if (next.done) break
      chunks.push(next.value)
    }
    const tarText = gunzipSync(Buffer.concat(chunks)).toString('latin1')
    const files = new Set(tarText.match(/d\/f\d+/g) ?? [])
    expect(files.size).toBe(1500)
    // Pruned once the export is done.
    await t.api.send(session.id, 'echo again >> log')
    for (let i = 0; i < 50 && existsSync(path); i++) await new Promise((r) => setTimeout(r, 100))
    expect(existsSync(path)).toBe(false)
  })

  it('a lowered keepAutoSnapshots prunes an idle session at the next retention pass, without a new turn', async () => {
    expect((await t.api.call('PUT', '/v1/retention', { keepAutoSnapshots: 10 })).status).toBe(200)
    const session = await t.api.createSession('shell')
    for (let i = 1; i <= 4; i++) await t.api.send(session.id, `echo ${i} >> log`)
    await t.api.snapshotAfter(session.id, 4)
    const autos = async () =>
      (
        (await t.api.call('GET', `/v1/sessions/${session.id}/snapshots`)).body.data as {
          id: string
          kind: string
          turn: number
        }[]
      ).filter((s) => s.kind === 'auto')
    const before = await autos()
    expect(before.length).toBe(5)
    const freedBefore = (await t.api.call('GET', '/v1/usage')).body.retention.deletedSnapshots

    expect((await t.api.call('PUT', '/v1/retention', { keepAutoSnapshots: 2 })).status).toBe(200)
    const applied = await t.server.retention.apply()
    expect(applied.snapshots).toBeGreaterThanOrEqual(3)
    const after = await autos()
    expect(after.map((s) => s.turn)).toEqual([3, 4])
    for (const gone of before.filter((s) => s.turn < 3))
      expect(existsSync(t.server.runtime.pool.snapshotPath(gone.id))).toBe(false)
    const usage = (await t.api.call('GET', '/v1/usage')).body
    expect(usage.retention.deletedSnapshots).toBeGreaterThanOrEqual(freedBefore + 3)
    // The session is as it was: idle, its workspace whole.
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body).toMatchObject({
      status: 'idle',
      turnCount: 4,
    })
  })
})
