import { existsSync, readdirSync } from 'node:fs'
import { gunzipSync } from 'node:zlib'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'
import { treeManifest } from './helpers/tree.js'

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  const shell = await makeProject({
    'cairn.yaml': 'name: shell\ncommand: bash agent.sh\n',
    'agent.sh': 'while IFS= read -r line; do bash -c "$line" </dev/null 2>&1; echo "[exit $?]"; done\n',
    'README.md': 'seed file from the revision\n',
  })
  expect((await t.api.deploy(shell)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

const run = async (id: string, command: string) => {
  const result = await t.api.send(id, command)
  expect(result.terminal?.type, JSON.stringify(result.events)).toBe('run.completed')
  return result.text
}

describe('workspace lifecycle', () => {
  it('restores an exact replica of a snapshot: names, contents, modes and links, nothing left from after it', async () => {
    const { id } = await t.api.createSession('shell')
    await run(
      id,
      'mkdir -p src/deep && echo one > src/a.txt && echo two > src/deep/b.txt && chmod 640 src/a.txt && ln -s deep/b.txt src/link && chmod 700 src/deep',
    )
    const snap = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, { label: 'good state' })
    expect(snap.status).toBe(201)
    expect(snap.body).toMatchObject({ kind: 'manual', reason: 'manual', label: 'good state', turn: 1 })
    const expected = await treeManifest(t.server.runtime.pool.snapshotPath(snap.body.id))
    await run(
      id,
      'echo changed > src/a.txt && chmod 777 src/a.txt && rm src/deep/b.txt && rm src/link && ln -s /etc/passwd src/link && echo new > later.txt && mkdir -p junk/x',
    )
    const restored = await t.api.call('POST', `/v1/sessions/${id}/restore`, { snapshotId: snap.body.id })
    expect(restored.status).toBe(200)
    expect(await treeManifest(t.server.runtime.pool.workspacePath(id))).toEqual(expected)
    expect(await run(id, 'cat src/a.txt src/link; ls later.txt')).toContain('one\ntwo\n')
    const events = await t.api.call('GET', `/v1/sessions/${id}/events`)
    expect(events.body.data.some((e: { cause: string }) => e.cause === 'workspace_restored')).toBe(true)
  })

  it('undoes the last turn: files a turn deleted come back', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo precious > keep.txt')
    await run(id, 'rm keep.txt README.md')
    expect(await run(id, 'ls')).toBe('agent.sh\ncairn.yaml\n[exit 0]\n')
    // The third turn above is now the last one; undo it, then the delete turn.
    await t.api.call('POST', `/v1/sessions/${id}/undo`)
    const undone = await t.api.call('POST', `/v1/sessions/${id}/restore`, { turn: 1 })
    expect(undone.body.snapshot.turn).toBe(1)
    expect(await run(id, 'cat keep.txt README.md')).toBe('precious\nseed file from the revision\n[exit 0]\n')
  })

  it('reuses the snapshot across a turn that wrote nothing; undo after the next, writing turn still restores the state before it', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo v1 > state.txt')
    await run(id, 'cat state.txt') // writes nothing
    // An append and an in-place overwrite: buffered writes to an existing file, which reach btrfs's
    // trees only when flushed, so they must be seen by other means than the subvolume's ctransid.
    await run(id, 'echo v3 >> state.txt && printf V | dd of=state.txt conv=notrunc status=none')
    const undone = await t.api.call('POST', `/v1/sessions/${id}/undo`)
    expect(undone.status).toBe(200)
    // The state before turn 3 is the one after turn 1: the snapshot taken then stands for turn 2 too.
    expect(undone.body.snapshot).toMatchObject({ kind: 'auto', reason: 'before_turn', turn: 1 })
    const snaps = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data as {
      id: string
      turn: number
    }[]
    expect(snaps.map((s) => s.turn)).toEqual([0, 1, 3])
    // A fork at turn 2 has the workspace after turn 1 (the same) and the transcript of both turns.
    const fork = await t.api.call('POST', `/v1/sessions/${id}/fork`, { turn: 2 })
    expect(fork.body).toMatchObject({ turnCount: 2 })
    expect(await run(fork.body.id, 'cat state.txt')).toBe('v1\n[exit 0]\n')
    const beforeTurn3 = await t.api.call('POST', `/v1/sessions/${id}/restore`, { turn: 2 })
    expect(beforeTurn3.body.snapshot.id).toBe(undone.body.snapshot.id)
    expect(await run(id, 'cat state.txt')).toBe('v1\n[exit 0]\n')
    // Turn 4 wrote nothing either, on a fresh sandbox (the restore stopped the old one): undoing
    // it keeps the restored state, and a writing turn after it is undone to that state too.
    await run(id, 'echo v5 >> state.txt')
    await t.api.call('POST', `/v1/sessions/${id}/undo`)
    expect(await run(id, 'cat state.txt')).toBe('v1\n[exit 0]\n')
  })

  it('forks at turn 2 of 4: the fork has the turn-2 workspace and a 2-turn transcript, and both go on independently', async () => {
    const { id } = await t.api.createSession('shell', { title: 'parent' })
    for (const n of [1, 2, 3, 4]) await run(id, `echo turn${n} >> log.txt`)
    const fork = await t.api.call('POST', `/v1/sessions/${id}/fork`, { turn: 2, title: 'child' })
    expect(fork.status).toBe(201)
    expect(fork.body).toMatchObject({ title: 'child', turnCount: 2, status: 'idle', statusCause: 'forked' })
    const child = fork.body.id as string
    expect(await run(child, 'cat log.txt')).toBe('turn1\nturn2\n[exit 0]\n')
    const transcript = await t.api.call('GET', `/v1/sessions/${child}/messages`)
    expect(transcript.body.data.filter((m: { role: string }) => m.role === 'user')).toHaveLength(3)
    await run(child, 'echo child-only >> log.txt')
    await run(id, 'echo parent-only >> log.txt')
    expect(await run(id, 'cat log.txt')).toBe('turn1\nturn2\nturn3\nturn4\nparent-only\n[exit 0]\n')
    expect(await run(child, 'cat log.txt')).toBe('turn1\nturn2\nchild-only\n[exit 0]\n')
  })

  it('lists, downloads, uploads and deletes files, confined to the workspace', async () => {
    const { id } = await t.api.createSession('shell')
    await run(
      id,
      'mkdir docs && printf "hello" > docs/hi.txt && ln -s /etc/hostname escape && ln -s ../../.. up',
    )
    const list = await t.api.call('GET', `/v1/sessions/${id}/files?path=/workspace/docs`)
    expect(list.body.data).toEqual([
      expect.objectContaining({ name: 'hi.txt', type: 'file', size: 5, path: '/workspace/docs/hi.txt' }),
    ])
    const root = await t.api.call('GET', `/v1/sessions/${id}/files?path=`)
    expect(root.body.data.find((e: { name: string }) => e.name === 'escape')).toMatchObject({
      type: 'symlink',
      target: '/etc/hostname',
    })
    const content = await t.api.call('GET', `/v1/sessions/${id}/files/content?path=docs/hi.txt`)
    expect(content.body).toBe('hello')
    expect((await t.api.call('GET', `/v1/sessions/${id}/files/content?path=escape`)).status).toBe(403)
    expect((await t.api.call('GET', `/v1/sessions/${id}/files?path=up`)).status).toBe(403)
    expect((await t.api.call('GET', `/v1/sessions/${id}/files/content?path=../../etc/passwd`)).status).toBe(
      400,
    )
    expect((await t.api.call('GET', `/v1/sessions/${id}/files/content?path=nope.txt`)).status).toBe(404)

    const put = await t.api.call(
      'PUT',
      `/v1/sessions/${id}/files/content?path=uploads/new.bin`,
      Buffer.from('uploaded bytes'),
      {
        'content-type': 'application/octet-stream',
      },
    )
    expect(put.body).toEqual({ ok: true })
    expect(await run(id, 'cat uploads/new.bin; stat -c %u uploads/new.bin')).toBe(
      'uploaded bytes1000\n[exit 0]\n',
    )
    // Writing through a planted symlink cannot reach the host.
    const through = await t.api.call(
      'PUT',
      `/v1/sessions/${id}/files/content?path=escape`,
      Buffer.from('x'),
      {
        'content-type': 'application/octet-stream',
      },
    )
    expect(through.status).toBe(403)
    expect((await t.api.call('DELETE', `/v1/sessions/${id}/files?path=docs`)).body).toEqual({ ok: true })
    expect(await run(id, 'ls docs')).toContain('No such file')

    const diff = await t.api.call('GET', `/v1/sessions/${id}/diff`)
    expect(diff.body.added).toEqual(expect.arrayContaining(['escape', 'uploads', 'uploads/new.bin']))
    expect(diff.body.deleted).toEqual([])
    const manifest = await t.api.call('GET', `/v1/sessions/${id}/manifest`)
    expect(manifest.body.dirtyFiles.added).toContain('uploads/new.bin')
    expect(manifest.body.revision.contentHash).toMatch(/^sha256:/)
    expect(manifest.body.snapshotIds.length).toBeGreaterThan(0)
  })

  it('exports the workspace as a tar.gz', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo exported > out.txt')
    const res = await fetch(`${t.url}/v1/sessions/${id}/export`, {
      headers: { authorization: `Bearer ${t.key}` },
    })
    expect(res.headers.get('content-type')).toBe('application/gzip')
    const tarText = gunzipSync(Buffer.from(await res.arrayBuffer())).toString('latin1')
    expect(tarText).toContain('out.txt')
    expect(tarText).toContain('exported')
    expect(tarText).toContain('README.md')
    const temp = readdirSync(`${t.server.runtime.pool.root}/snapshots`).length
    await new Promise((r) => setTimeout(r, 50))
    expect(readdirSync(`${t.server.runtime.pool.root}/snapshots`).length).toBeLessThanOrEqual(temp)
  })

  it('refuses a restore while a turn runs, and deleting a session leaves no subvolume behind', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo x > x')
    const slow = t.api.send(id, 'sleep 1')
    await new Promise((r) => setTimeout(r, 300))
    const busy = await t.api.call('POST', `/v1/sessions/${id}/restore`, { turn: 0 })
    expect(busy.status).toBe(409)
    expect(busy.body.error.code).toBe('session_busy')
    await slow
    const snaps = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data as { id: string }[]
    expect(snaps.length).toBeGreaterThanOrEqual(2)
    await t.api.call('DELETE', `/v1/sessions/${id}`)
    expect(existsSync(t.server.runtime.pool.workspacePath(id))).toBe(false)
    for (const snap of snaps) expect(existsSync(t.server.runtime.pool.snapshotPath(snap.id))).toBe(false)
  })
})
