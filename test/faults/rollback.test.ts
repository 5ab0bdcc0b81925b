import { execFile } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import { afterAll, describe, expect, it } from 'vitest'
import { KEEPER_PROJECT, makeProject } from '../helpers/projects.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'

const run = promisify(execFile)
const servers: TestServer[] = []
const dirs: string[] = []

afterAll(async () => {
  for (const s of servers) await s.close().catch(() => undefined)
  for (const d of dirs) await rm(d, { recursive: true, force: true })
})

async function keeper(t: TestServer): Promise<void> {
  expect((await t.api.deploy(await makeProject(KEEPER_PROJECT))).status).toBe(201)
}

/** Replaces a workspace with an older snapshot of it using btrfs directly, behind Cairn's back. */
async function rollBack(t: TestServer, sessionId: string, snapshotId: string): Promise<void> {
  const pool = t.server.runtime.pool
  await run('btrfs', ['subvolume', 'delete', pool.workspacePath(sessionId)])
  await run('btrfs', ['subvolume', 'snapshot', pool.snapshotPath(snapshotId), pool.workspacePath(sessionId)])
}

describe('a workspace rolled back outside Cairn is refused with state_lost', () => {
  it('on the next message and on resume, with the reason in the events; a restore recovers it', async () => {
    const t = await startTestServer()
    servers.push(t)
    await keeper(t)
    const session = await t.api.createSession('keeper', { keepWarmMs: 0 })
    expect((await t.api.send(session.id, 'one')).text).toBe('kept one\n')
    const afterOne = await t.api.snapshotAfter(session.id, 1)
    expect((await t.api.send(session.id, 'two')).text).toBe('kept one two\n')
    await t.api.snapshotAfter(session.id, 2)
    const put = await t.api.call(
      'PUT',
      `/v1/sessions/${session.id}/files/content?path=notes.txt`,
      Buffer.from('written through the API'),
      { 'content-type': 'application/octet-stream' },
    )
    expect(put.status).toBe(200)
    // Every turn and the file write moved the generation forward.
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body.generation).toBe(3)

    await rollBack(t, session.id, afterOne)
    const refused = await t.api.send(session.id, 'three')
    expect(refused.status).toBe(500)
    expect(refused.body).toMatchObject({
      error: { code: 'state_lost', details: { workspaceGeneration: 1, recordedGeneration: 3 } },
    })
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body).toMatchObject({
      status: 'failed',
      statusCause: 'state_lost',
    })
    const events = (await t.api.call('GET', `/v1/sessions/${session.id}/events`)).body.data
    const lost = events.find((e: { cause: string }) => e.cause === 'state_lost')
    expect(lost.detail).toContain('generation 1 but generation 3 was recorded')
    expect(lost.detail).toContain('rolled back or replaced outside Cairn')
    const resume = await t.api.call('POST', `/v1/sessions/${session.id}/resume`)
    expect(resume.status).toBe(500)
    expect(resume.body.error.code).toBe('state_lost')
    // The transcript was not touched by the refused message.
    expect((await t.api.call('GET', `/v1/sessions/${session.id}/messages`)).body.data).toHaveLength(4)

    // Restoring a known snapshot is a new generation: the session can go on from there.
    const restored = await t.api.call('POST', `/v1/sessions/${session.id}/restore`, { turn: 2 })
    expect(restored.status).toBe(200)
    expect(restored.body.session.generation).toBe(4)
    expect((await t.api.send(session.id, 'three')).text).toBe('kept one two three\n')
  })

  it('at start-up: the reconciliation marks the session failed with state_lost', async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-rollback-'))
    dirs.push(dataDir)
    const first = await startTestServer({ dataDir })
    await keeper(first)
    const kept = await first.api.createSession('keeper', { keepWarmMs: 0 })
    const rolled = await first.api.createSession('keeper', { keepWarmMs: 0 })
    for (const id of [kept.id, rolled.id]) {
      expect((await first.api.send(id, 'a')).text).toBe('kept a\n')
      expect((await first.api.send(id, 'b')).text).toBe('kept a b\n')
    }
    await first.api.snapshotAfter(kept.id, 2)
    await first.api.snapshotAfter(rolled.id, 2)
    await rollBack(first, rolled.id, await first.api.snapshotAfter(rolled.id, 1))
    await first.close()

    const second = await startTestServer({ dataDir })
    servers.push(second)
    const api = new Api(second.url, first.key)
    expect((await api.call('GET', `/v1/sessions/${kept.id}`)).body).toMatchObject({
      status: 'idle',
      generation: 2,
    })
    expect((await api.call('GET', `/v1/sessions/${rolled.id}`)).body).toMatchObject({
      status: 'failed',
      statusCause: 'state_lost',
    })
    expect((await api.send(kept.id, 'c')).text).toBe('kept a b c\n')
    const refused = await api.send(rolled.id, 'c')
    expect(refused.status).toBe(500)
    expect(refused.body).toMatchObject({ error: { code: 'state_lost' } })
  })
})
