import { existsSync, readdirSync } from 'node:fs'
import { gunzipSync } from 'node:zlib'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { rawTarGz } from './helpers/raw-tar.js'
import { startTestServer, type TestServer } from './helpers/server.js'
import { treeManifest } from './helpers/tree.js'

let t: TestServer
let gvisorAvailable = false

beforeAll(async () => {
  t = await startTestServer({ server: { maxUploadBytes: 8 * 1024 * 1024 } })
  const shell = await makeProject({
    ...SHELL_PROJECT,
    'README.md': 'seed file from the revision\n',
  })
  expect((await t.api.deploy(shell)).status).toBe(201)
  // The same agent under gVisor, whose writes reach the host through its sentry, gofer and stubs.
  const drivers = (await t.api.call('GET', '/v1/runtime')).body.drivers as {
    name: string
    available: boolean
  }[]
  gvisorAvailable = drivers.some((d) => d.name === 'gvisor' && d.available)
  const boxed = await makeProject({
    ...SHELL_PROJECT,
    'cairn.yaml': 'name: shell-gvisor\ncommand: bash agent.sh\nisolation: gvisor\n',
    'README.md': 'seed file from the revision\n',
  })
  expect((await t.api.deploy(boxed)).status).toBe(201)
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

  it.each([
    ['bwrap', 'shell'],
    ['gvisor', 'shell-gvisor'],
  ])(
    'reuses the snapshot across a turn that wrote nothing; undo after the next, writing turn still restores the state before it (%s)',
    async (isolation, agent, ctx) => {
      if (isolation === 'gvisor' && !gvisorAvailable) ctx.skip()
      const { id } = await t.api.createSession(agent)
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
        throughTurn: number
      }[]
      expect(snaps.map((s) => s.turn)).toEqual([0, 1, 3])
      // The listing says which turns each snapshot stands for: the one after turn 1 is also turn 2's.
      expect(snaps.map((s) => s.throughTurn)).toEqual([0, 2, 3])
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
      // A store through a shared mapping, left unflushed, by a process that exits: under gVisor
      // the page is dirtied by the stub process holding the agent's address space, not the sentry.
      // Missing it would let the snapshot before it stand for it: undoing the next turn (which
      // writes nothing) would then lose the store.
      await run(
        id,
        `python3 -c "import mmap; f = open('state.txt', 'r+b'); m = mmap.mmap(f.fileno(), 0); m[0:2] = b'M6'"`,
      )
      expect(await run(id, 'cat state.txt')).toBe('M6\n[exit 0]\n')
      expect((await t.api.call('POST', `/v1/sessions/${id}/undo`)).status).toBe(200)
      expect(await run(id, 'cat state.txt')).toBe('M6\n[exit 0]\n')
    },
  )

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

  it('a session deleted under each workspace operation answers it 2xx or session_deleted, never a 5xx, and a forks request makes all or none', async () => {
    // Each fork read its parent again: deleted part way, a forks request answered 404 not_found
    // ("No snapshot") while the forks made before it stayed, named to nobody; an operation begun
    // while the deletion ran snapshotted a workspace being deleted (500 storage_error).
    const ops: [string, (id: string, snapshotId: string) => unknown][] = [
      ['forks', () => ({ count: 16 })],
      ['snapshots', () => ({})],
      ['fork', () => ({ turn: 1 })],
      ['restore', (_id, snapshotId) => ({ snapshotId })],
      ['commands', () => ({ command: ['true'] })],
    ]
    for (const [route, body] of ops)
      for (const delayMs of [0, 25]) {
        const title = `deleted-under-${route}-${delayMs}`
        const { id } = await t.api.createSession('shell', { title })
        await run(id, 'echo kept > f')
        const snap = (await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})).body.id
        const answer = t.api.call('POST', `/v1/sessions/${id}/${route}`, body(id, snap))
        await new Promise((resolve) => setTimeout(resolve, delayMs))
        const deleted = await t.api.call('DELETE', `/v1/sessions/${id}`)
        const { status, body: got } = await answer
        const what = `${route} ${delayMs} ms: ${status} ${JSON.stringify(got)}`
        expect(deleted.status === 200 || deleted.body.error?.code === 'session_busy', what).toBe(true)
        expect(status < 300 || got.error?.code === 'session_deleted', what).toBe(true)
        if (route !== 'forks') continue
        const listed = (await t.api.call('GET', '/v1/sessions?limit=500')).body.data as {
          id: string
          title: string
        }[]
        const made = listed.filter((s) => s.id !== id && s.title.startsWith(title)).map((s) => s.id)
        expect(made.sort(), what).toEqual(
          status === 201 ? got.sessions.map((s: { id: string }) => s.id).sort() : [],
        )
      }
  })

  it('answers each workspace operation on a deleted session 410 session_deleted, whatever snapshot or turn it names', async () => {
    // POST …/fork {snapshotId} answered 404 not_found ("No snapshot"): its snapshots went with it.
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo kept > f')
    const snap = (await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})).body.id as string
    const other = await t.api.createSession('shell')
    const otherSnap = (await t.api.call('POST', `/v1/sessions/${other.id}/snapshots`, {})).body.id as string
    expect((await t.api.call('DELETE', `/v1/sessions/${id}`)).status).toBe(200)
    const picks = fc.sample(
      fc.oneof(
        fc.record({ snapshotId: fc.constantFrom(snap, otherSnap, 'snp_0000000000000000') }),
        fc.record({ turn: fc.integer({ min: 0, max: 3 }) }),
        fc.record({ snapshotId: fc.constant(snap), title: fc.string({ maxLength: 8 }) }),
      ),
      { numRuns: 10, seed: 7 },
    )
    const ops: [string, unknown[]][] = [
      ['fork', [{ snapshotId: snap }, ...picks]],
      ['restore', [{ snapshotId: snap }, ...picks.filter((p) => !('title' in p))]],
      ['forks', [{}, { count: 2 }]],
      ['snapshots', [{}]],
      ['undo', [undefined]],
      ['commands', [{ command: ['true'] }]],
    ]
    for (const [route, bodies] of ops)
      for (const body of bodies) {
        const res = await t.api.call('POST', `/v1/sessions/${id}/${route}`, body)
        expect(`${res.status} ${res.body.error?.code}`, `${route} ${JSON.stringify(body)}`).toBe(
          '410 session_deleted',
        )
      }
  })

  it('leaves no snapshot behind when a forks request fails after taking it (it counted toward the cap)', async () => {
    // The forks are refused (a policy whose maxTurns leaves them no turn) only after the request's
    // snapshot was taken: it stayed, listed and counted as one of the session's manual snapshots.
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo kept > f')
    // Its manual snapshots, which the cap counts (the forks' snapshot first brings the session's
    // automatic one of its last turn, which its next turn would have taken: that one stays).
    const manual = async () =>
      ((await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data as { id: string; kind: string }[])
        .filter((s) => s.kind === 'manual')
        .map((s) => s.id)
    const before = await manual()
    const refused = await t.api.call('POST', `/v1/sessions/${id}/forks`, {
      count: 2,
      policy: { maxTurns: 1 },
    })
    expect(refused.body.error?.code, JSON.stringify(refused.body)).toBe('turn_limit_reached')
    expect(await manual()).toEqual(before)
    // One taken since is the session's first: the cap counts none from the failed request.
    const taken = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, { label: 'after' })
    expect(taken.status).toBe(201)
    expect(await manual()).toEqual([...before, taken.body.id])
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
    // The turn's own snapshot lands after its answer: counted before the export.
    const turnSnapshot = async () =>
      ((await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data as { turn: number }[]).some(
        (s) => s.turn === 1,
      )
    for (let i = 0; i < 100 && !(await turnSnapshot()); i++) await new Promise((r) => setTimeout(r, 50))
    const before = readdirSync(`${t.server.runtime.pool.root}/snapshots`).length
    const res = await fetch(`${t.url}/v1/sessions/${id}/export`, {
      headers: { authorization: `Bearer ${t.key}` },
    })
    expect(res.headers.get('content-type')).toBe('application/gzip')
    const tarText = gunzipSync(Buffer.from(await res.arrayBuffer())).toString('latin1')
    expect(tarText).toContain('out.txt')
    expect(tarText).toContain('exported')
    expect(tarText).toContain('README.md')
    // The temporary snapshot is gone once the answer is sent.
    const left = () => readdirSync(`${t.server.runtime.pool.root}/snapshots`).length
    for (let i = 0; i < 50 && left() > before; i++) await new Promise((r) => setTimeout(r, 50))
    expect(left()).toBeLessThanOrEqual(before)
  })

  it('digests a snapshot lazily: identical trees agree, content, mode and link target changes do not', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'mkdir d && echo a > d/f && chmod 640 d/f && ln -s d/f l')
    const snapshot = async () =>
      (await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})).body.id as string
    const digestOf = async (snapId: string) => {
      const res = await t.api.call('GET', `/v1/sessions/${id}/snapshots/${snapId}?digest=true`)
      expect(res.status).toBe(200)
      expect(res.body.digest).toMatch(/^sha256:[0-9a-f]{64}$/)
      return res.body.digest as string
    }
    const base = await snapshot()
    const plain = await t.api.call('GET', `/v1/sessions/${id}/snapshots/${base}`)
    expect(plain.body, JSON.stringify(plain.body)).toMatchObject({ id: base, digest: null })
    const same = await snapshot()
    const baseDigest = await digestOf(base)
    expect(await digestOf(same)).toBe(baseDigest)
    // Computed once, then stored: the plain listing now carries it.
    const listed = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data
    expect(listed.find((s: { id: string }) => s.id === base).digest).toBe(baseDigest)

    await run(id, 'echo b > d/f')
    expect(await digestOf(await snapshot())).not.toBe(baseDigest)
    // Same content written again (new mtime): times are not part of the digest.
    await run(id, 'echo a > d/f')
    expect(await digestOf(await snapshot())).toBe(baseDigest)
    await run(id, 'chmod 600 d/f')
    expect(await digestOf(await snapshot())).not.toBe(baseDigest)
    await run(id, 'chmod 640 d/f && ln -sfn d l')
    expect(await digestOf(await snapshot())).not.toBe(baseDigest)
    await run(id, 'ln -sfn d/f l')
    const last = await snapshot()
    const all = (await t.api.call('GET', `/v1/sessions/${id}/snapshots?digest=true`)).body.data
    expect(all.find((s: { id: string }) => s.id === last).digest).toBe(baseDigest)
    expect(all.every((s: { digest: string | null }) => typeof s.digest === 'string')).toBe(true)
    expect((await t.api.call('GET', `/v1/sessions/${id}/snapshots/snap_nope?digest=true`)).status).toBe(404)
  })

  it('imports an exported workspace into a fresh session as an identical tree, and the import can be undone', async () => {
    const { id: source } = await t.api.createSession('shell')
    await run(
      source,
      'mkdir -p src/deep ro && echo one > src/a.txt && printf "\\0bin" > src/deep/b.bin && chmod 751 src/deep && chmod 600 src/a.txt && ln -s deep/b.bin src/link && ln src/a.txt hard.txt && echo x > ro/f && chmod 555 ro',
    )
    const exported = await fetch(`${t.url}/v1/sessions/${source}/export`, {
      headers: { authorization: `Bearer ${t.key}` },
    })
    const archive = Buffer.from(await exported.arrayBuffer())

    const { id: target } = await t.api.createSession('shell')
    await run(target, 'echo only-here > stray.txt')
    const before = await treeManifest(t.server.runtime.pool.workspacePath(target))
    const imported = await t.api.call('PUT', `/v1/sessions/${target}/workspace`, archive)
    expect(imported.status, JSON.stringify(imported.body)).toBe(200)
    expect(imported.body).toMatchObject({ snapshot: { reason: 'before_import', kind: 'manual' } })
    expect(imported.body.fileCount).toBeGreaterThan(8)
    const sourceTree = await treeManifest(t.server.runtime.pool.workspacePath(source))
    expect(await treeManifest(t.server.runtime.pool.workspacePath(target))).toEqual(sourceTree)
    // The agent owns what was imported and goes on with it.
    expect(await run(target, 'stat -c %u src/a.txt; cat src/a.txt; ls stray.txt')).toContain(
      '1000\none\nls: cannot access',
    )
    // Same tree, same digest.
    const digest = async (id: string) => {
      const snap = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})
      return (await t.api.call('GET', `/v1/sessions/${id}/snapshots/${snap.body.id}?digest=true`)).body.digest
    }
    expect(await digest(target)).toBe(await digest(source))
    const events = (await t.api.call('GET', `/v1/sessions/${target}/events`)).body.data
    expect(events.some((e: { cause: string }) => e.cause === 'workspace_imported')).toBe(true)

    const undone = await t.api.call('POST', `/v1/sessions/${target}/restore`, {
      snapshotId: imported.body.snapshot.id,
    })
    expect(undone.status).toBe(200)
    expect(await treeManifest(t.server.runtime.pool.workspacePath(target))).toEqual(before)
  })

  it('merges an archive over the workspace on request', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo mine > mine.txt && echo old > shared.txt')
    const archive = rawTarGz([
      { name: 'shared.txt', body: 'new\n' },
      { name: 'added/', type: '5', mode: 0o755 },
      { name: 'added/file.txt', body: 'added\n', mode: 0o640 },
    ])
    const merged = await t.api.call('PUT', `/v1/sessions/${id}/workspace?mode=merge`, archive)
    expect(merged.status, JSON.stringify(merged.body)).toBe(200)
    expect(merged.body.fileCount).toBe(3)
    expect(await run(id, 'cat mine.txt shared.txt added/file.txt; stat -c %a added/file.txt')).toBe(
      'mine\nnew\nadded\n640\n[exit 0]\n',
    )
  })

  it('refuses hostile archives with a typed error and leaves the workspace as it was', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo keep > keep.txt && ln -s /etc planted')
    const before = await treeManifest(t.server.runtime.pool.workspacePath(id))
    const hostile = [
      [
        { name: 'ok.txt', body: 'fine' },
        { name: '../escape.txt', body: 'x' },
      ],
      [{ name: '/tmp/cairn-absolute.txt', body: 'x' }],
      [{ name: 'out', type: '2' as const, linkname: '../../../etc' }],
      [{ name: 'abs-link', type: '2' as const, linkname: '/etc/passwd' }],
      [{ name: 'dev', type: '3' as const }],
      [
        { name: 'up', type: '2' as const, linkname: '.' },
        { name: 'up/out', type: '2' as const, linkname: '..' },
      ],
    ]
    for (const entries of hostile) {
      const res = await t.api.call('PUT', `/v1/sessions/${id}/workspace?mode=merge`, rawTarGz(entries))
      expect(res.status, JSON.stringify(entries)).toBe(400)
      expect(res.body.error.code).toBe('invalid_archive')
    }
    const garbage = await t.api.call('PUT', `/v1/sessions/${id}/workspace`, Buffer.from('not a tarball'))
    expect(garbage.body.error.code).toBe('invalid_archive')
    const tooBig = await t.api.call('PUT', `/v1/sessions/${id}/workspace`, Buffer.alloc(9 * 1024 * 1024))
    expect(tooBig.status).toBe(413)
    expect(tooBig.body.error.code).toBe('payload_too_large')
    const json = await t.api.call('PUT', `/v1/sessions/${id}/workspace`, { not: 'an archive' })
    expect(json.body.error.code).toBe('unsupported_media_type')
    expect(await treeManifest(t.server.runtime.pool.workspacePath(id))).toEqual(before)
    expect(existsSync('/tmp/cairn-absolute.txt')).toBe(false)
    // Refused before any snapshot was taken.
    const snapshots = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data
    expect(snapshots.filter((s: { reason: string }) => s.reason === 'before_import')).toEqual([])

    // While a turn runs: session_busy, and nothing changes.
    const slow = t.api.send(id, 'sleep 1')
    await new Promise((r) => setTimeout(r, 300))
    const busy = await t.api.call('PUT', `/v1/sessions/${id}/workspace`, rawTarGz([{ name: 'a', body: 'a' }]))
    expect(busy.status).toBe(409)
    expect(busy.body.error.code).toBe('session_busy')
    await slow
    expect(await treeManifest(t.server.runtime.pool.workspacePath(id))).toEqual(before)
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
