import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { closeOwned } from './helpers/pool-owners.js'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// Merging a fork back (issue 32 item 6) against a real server and btrfs pool: one server, one
// parent and its fork, edited through the files API on both sides. About 30 s on a loaded 2-core
// machine, over 20 s because every file written (about 40, by the tests and by the merges) starts
// two short sandboxes of the sandboxed writer, and three turns run.
let t: TestServer
let parent: string
let fork: string
let forkPoint: string

const lines = (n: number, change: Record<number, string> = {}) =>
  Array.from({ length: n }, (_, i) => change[i] ?? `line ${i}`).join('\n') + '\n'
const BINARY = Buffer.from([0, 1, 2, 3, 0xff, 0xfe, 0])
const MiB = 1024 * 1024
const TENANT_MIB = 128

async function put(id: string, path: string, content: string | Buffer) {
  const body = typeof content === 'string' ? Buffer.from(content) : content
  const res = await t.api.call('PUT', `/v1/sessions/${id}/files/content?path=${path}`, body, {
    'content-type': 'application/octet-stream',
  })
  expect(res.status, JSON.stringify(res.body)).toBe(200)
}

async function read(id: string, path: string, snapshot?: string): Promise<Buffer | undefined> {
  const query = `path=${path}${snapshot ? `&snapshot=${snapshot}` : ''}`
  const res = await fetch(`${t.url}/v1/sessions/${id}/files/content?${query}`, {
    headers: { authorization: `Bearer ${t.key}` },
  })
  if (res.status === 404) return undefined
  expect(res.status).toBe(200)
  return Buffer.from(await res.arrayBuffer())
}

const text = async (id: string, path: string) => (await read(id, path))?.toString('utf8')
const merge = (id: string, body: Record<string, unknown> = {}) =>
  t.api.call('POST', `/v1/sessions/${id}/merge`, body)

beforeAll(async () => {
  // A tenant quota, so a merge's writes are reserved against it (a sparse file below outgrows it).
  t = await startTestServer({ server: { tenantQuotaMiB: TENANT_MIB } })
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
  parent = (await t.api.createSession('shell')).id
  await put(parent, 'notes.txt', lines(10))
  await put(parent, 'same.txt', lines(3))
  await put(parent, 'gone.txt', 'to be deleted in the fork\n')
  await put(parent, 'logo.bin', BINARY)
  await put(parent, 'both.txt', 'deleted in the fork, changed in the parent\n')
  forkPoint = (await t.api.call('POST', `/v1/sessions/${parent}/snapshots`, { label: 'fork point' })).body.id
  const forked = await t.api.call('POST', `/v1/sessions/${parent}/fork`, { snapshotId: forkPoint })
  expect(forked.status).toBe(201)
  fork = forked.body.id
  // The fork: line 1, line 0 of same.txt, a file added, a file deleted, the binary changed.
  await put(fork, 'notes.txt', lines(10, { 1: 'line 1 from the fork' }))
  await put(fork, 'same.txt', lines(3, { 0: 'fork' }))
  await put(fork, 'src/new.txt', 'added in the fork\n')
  expect((await t.api.call('DELETE', `/v1/sessions/${fork}/files?path=gone.txt`)).status).toBe(200)
  await put(fork, 'logo.bin', Buffer.concat([BINARY, Buffer.from([1])]))
  expect((await t.api.call('DELETE', `/v1/sessions/${fork}/files?path=both.txt`)).status).toBe(200)
  await put(fork, 'd/a.txt', 'a directory d in the fork\n')
  // The parent: line 8, the same line 0, the binary changed differently.
  await put(parent, 'notes.txt', lines(10, { 8: 'line 8 from the parent' }))
  await put(parent, 'same.txt', lines(3, { 0: 'parent' }))
  await put(parent, 'logo.bin', Buffer.concat([BINARY, Buffer.from([2])]))
  await put(parent, 'both.txt', 'changed in the parent\n')
  await put(parent, 'd', 'a file d in the parent\n')
})

afterAll(async () => {
  await closeOwned(t)
})

const expectedConflicts = [
  { path: 'both.txt', kind: 'delete_modify', deletedIn: 'fork', resolution: 'keep' },
  { path: 'd', kind: 'type', resolution: 'keep' },
  { path: 'd/a.txt', kind: 'type', resolution: 'keep' },
  { path: 'logo.bin', kind: 'content', binary: true, resolution: 'keep' },
  { path: 'same.txt', kind: 'content', binary: false, resolution: 'keep' },
]

describe('merging a fork back', () => {
  it('previews without changing anything, then merges, records where it came from, and is undone by a restore', async () => {
    const snapshotsBefore = (await t.api.call('GET', `/v1/sessions/${parent}/snapshots`)).body.data.length
    const preview = await merge(fork, { preview: true })
    expect(preview.status, JSON.stringify(preview.body)).toBe(200)
    expect(preview.body).toMatchObject({
      preview: true,
      snapshot: null,
      fork: { sessionId: fork, snapshotId: null },
      base: { sessionId: parent, snapshotId: forkPoint },
      into: { id: parent },
    })
    const changes = [
      { path: 'notes.txt', action: 'update', how: 'merged' },
      { path: 'src/new.txt', action: 'add', how: 'taken' },
      { path: 'gone.txt', action: 'delete', how: 'taken' },
    ]
    expect(preview.body.changes).toEqual(changes)
    expect(preview.body.conflicts).toMatchObject(expectedConflicts)
    // Nothing changed: files, snapshots.
    expect(await text(parent, 'notes.txt')).toBe(lines(10, { 8: 'line 8 from the parent' }))
    expect(await text(parent, 'src/new.txt')).toBeUndefined()
    expect(await text(parent, 'gone.txt')).toBeDefined()
    expect((await t.api.call('GET', `/v1/sessions/${parent}/snapshots`)).body.data).toHaveLength(
      snapshotsBefore,
    )

    const merged = await merge(fork)
    expect(merged.status, JSON.stringify(merged.body)).toBe(200)
    expect(merged.body).toMatchObject({ preview: false, strategy: 'keep', changes })
    expect(merged.body.conflicts).toMatchObject(expectedConflicts)
    const undo = merged.body.snapshot
    expect(undo).toMatchObject({ kind: 'manual', reason: 'before_merge' })
    expect(await text(parent, 'notes.txt')).toBe(
      lines(10, { 1: 'line 1 from the fork', 8: 'line 8 from the parent' }),
    )
    expect(await text(parent, 'src/new.txt')).toBe('added in the fork\n')
    expect(await text(parent, 'gone.txt')).toBeUndefined()
    // Conflicts: the target keeps its own version.
    expect(await text(parent, 'same.txt')).toBe(lines(3, { 0: 'parent' }))
    expect(await read(parent, 'logo.bin')).toEqual(Buffer.concat([BINARY, Buffer.from([2])]))
    expect(await text(parent, 'both.txt')).toBe('changed in the parent\n')
    expect(await text(parent, 'd')).toBe('a file d in the parent\n')
    const events = (await t.api.call('GET', `/v1/sessions/${parent}/events`)).body.data as {
      cause: string
      detail: string
    }[]
    const recorded = events.find((e) => e.cause === 'workspace_merged')
    expect(recorded?.detail).toContain(`from fork ${fork} (its workspace), fork point ${forkPoint}`)
    expect(recorded?.detail).toContain(`undo: restore ${undo.id}`)

    const restored = await t.api.call('POST', `/v1/sessions/${parent}/restore`, { snapshotId: undo.id })
    expect(restored.status).toBe(200)
    expect(await text(parent, 'notes.txt')).toBe(lines(10, { 8: 'line 8 from the parent' }))
    expect(await text(parent, 'src/new.txt')).toBeUndefined()
    expect(await text(parent, 'gone.txt')).toBe('to be deleted in the fork\n')
  })

  it('writes conflict markers with strategy markers, and merges a named snapshot of the fork into a sibling', async () => {
    const marked = await merge(fork, { strategy: 'markers' })
    expect(marked.status, JSON.stringify(marked.body)).toBe(200)
    expect(marked.body.conflicts).toContainEqual(
      expect.objectContaining({ path: 'same.txt', kind: 'content', resolution: 'markers' }),
    )
    expect(await text(parent, 'same.txt')).toBe(
      `<<<<<<< target ${parent}\nparent\n||||||| fork point ${forkPoint}\nline 0\n=======\nfork\n>>>>>>> fork ${fork}\nline 1\nline 2\n`,
    )
    // A sibling fork of the same point gets the fork's changes as they were at a snapshot.
    const sibling = (await t.api.call('POST', `/v1/sessions/${parent}/fork`, { snapshotId: forkPoint })).body
      .id
    const at = (await t.api.call('POST', `/v1/sessions/${fork}/snapshots`, {})).body.id
    await put(fork, 'later.txt', 'after the snapshot\n')
    const into = await merge(fork, { into: sibling, snapshotId: at })
    expect(into.status, JSON.stringify(into.body)).toBe(200)
    expect(into.body).toMatchObject({ fork: { snapshotId: at }, into: { id: sibling }, conflicts: [] })
    expect(await text(sibling, 'same.txt')).toBe(lines(3, { 0: 'fork' }))
    expect(await text(sibling, 'later.txt')).toBeUndefined()
    expect(await text(sibling, 'd/a.txt')).toBe('a directory d in the fork\n')
    expect(await text(sibling, 'both.txt')).toBeUndefined()
  })

  it('refuses bad input with typed errors and a busy target with session_busy', async () => {
    const expectError = async (
      res: { status: number; body: { error: { code: string } } },
      status: number,
      code: string,
    ) => {
      expect(res.status, JSON.stringify(res.body)).toBe(status)
      expect(res.body.error.code).toBe(code)
    }
    await expectError(await merge('ses_nothere'), 404, 'session_not_found')
    await expectError(await merge(parent), 409, 'merge_base_missing')
    await expectError(await merge(fork, { into: fork }), 400, 'validation_failed')
    await expectError(await merge(fork, { preview: 'yes' }), 400, 'validation_failed')
    await expectError(await merge(fork, { strategy: 'theirs' }), 400, 'validation_failed')
    await expectError(await merge(fork, { snapshotId: 'snap_nothere' }), 404, 'not_found')
    const other = await makeProject({
      ...SHELL_PROJECT,
      'cairn.yaml': 'name: other\ncommand: bash agent.sh\n',
    })
    expect((await t.api.deploy(other)).status).toBe(201)
    const stranger = (await t.api.createSession('other')).id
    await expectError(await merge(fork, { into: stranger }), 400, 'validation_failed')
    // Another tenant sees neither session.
    const key = (await t.api.call('POST', '/v1/keys', { tenant: 'tnt_merge_other', name: 'other' })).body.key
    const res = await fetch(`${t.url}/v1/sessions/${fork}/merge`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: '{}',
    })
    expect(res.status).toBe(404)

    // The target runs a turn: the merge waits for nothing and answers session_busy.
    const turn = t.api.send(parent, 'sleep 3; echo done')
    for (let i = 0; i < 200; i++) {
      if ((await t.api.call('GET', `/v1/sessions/${parent}`)).body.status === 'active') break
      await new Promise((r) => setTimeout(r, 25))
    }
    await expectError(await merge(fork), 409, 'session_busy')
    expect((await turn).terminal?.type).toBe('run.completed')

    // A sparse file the size of twice the tenant quota, written whole by the merge: refused before
    // anything is written (the budget's answer names the bytes asked), the target as it was.
    expect((await t.api.send(fork, `truncate -s ${2 * TENANT_MIB}M big.bin`)).terminal?.type).toBe(
      'run.completed',
    )
    const before = await text(parent, 'notes.txt')
    const over = await merge(fork)
    await expectError(over, 507, 'quota_exceeded')
    expect(over.body.error.details.askedBytes).toBeGreaterThanOrEqual(2 * TENANT_MIB * MiB)
    expect(await read(parent, 'big.bin')).toBeUndefined()
    expect(await text(parent, 'notes.txt')).toBe(before)

    // The fork point deleted: no base to merge against.
    expect((await t.api.call('DELETE', `/v1/sessions/${parent}/snapshots/${forkPoint}`)).status).toBe(200)
    await expectError(await merge(fork, { preview: true }), 409, 'merge_base_missing')
  })
})
