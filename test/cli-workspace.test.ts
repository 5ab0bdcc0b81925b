import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, cliOf, jsonLines } from './helpers/cli.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
let work: string
let env: Record<string, string>

const { cairn, json } = cliOf(() => env)
const notesOf = async (id: string) => (await cairn(['sessions', 'cat', id, 'notes.md'])).stdout

beforeAll(async () => {
  assertBuilt()
  t = await startTestServer()
  work = await mkdtemp(path.join(os.tmpdir(), 'cairn-cli-ws-'))
  env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: work }
  expect((await cairn(['deploy', `${EXAMPLES}/notes`])).code).toBe(0)
})

afterAll(async () => {
  await t?.close()
  if (work) await rm(work, { recursive: true, force: true })
})

describe('workspace commands', () => {
  it('lists, reads, diffs, snapshots, undoes, restores, forks and exports a workspace', async () => {
    const [first] = jsonLines((await cairn(['run', 'notes', '--json', 'The sky is blue', '--single'])).stdout)
    const id = String(first?.sessionId).slice(0, 12)

    const files = await cairn(['sessions', 'files', id])
    expect(files.stdout).toMatch(/^Type\s+Size\s+Modified\s+Name/)
    expect(files.stdout).toContain('notes.md')
    expect((await json(['sessions', 'files', id])).map((e: { name: string }) => e.name)).toContain('notes.md')
    expect(await notesOf(id)).toContain('The sky is blue')
    expect(await json(['sessions', 'cat', id, 'notes.md'])).toMatchObject({ path: 'notes.md' })

    expect((await cairn(['sessions', 'diff', id])).stdout).toContain('A notes.md')
    expect((await json(['sessions', 'diff', id])).added).toContain('notes.md')

    const snapshot = await json(['sessions', 'snapshot', id, '--label', 'one fact'])
    expect(snapshot).toMatchObject({ kind: 'manual', label: 'one fact', turn: 1 })
    const listed = await cairn(['sessions', 'snapshots', id])
    expect(listed.stdout).toContain(snapshot.id)
    expect(listed.stdout).toContain('one fact')
    expect((await json(['sessions', 'snapshots', id])).length).toBeGreaterThanOrEqual(2)

    await cairn(['run', 'notes', '--session', id, 'Grass is green', '--single'])
    expect(await notesOf(id)).toContain('Grass is green')
    expect((await cairn(['sessions', 'diff', id, '--from', snapshot.id.slice(5, 12)])).stdout).toContain(
      'M notes.md',
    )

    const undone = await cairn(['sessions', 'undo', id])
    expect(undone.stdout).toMatch(/^Restored ses_[a-z0-9]{8} to snap_/)
    expect(await notesOf(id)).not.toContain('Grass is green')

    const restored = await json(['sessions', 'restore', id, '--turn', '0'])
    expect(restored.snapshot.turn).toBe(0)
    expect((await cairn(['sessions', 'cat', id, 'notes.md'])).code).toBe(1)

    expect((await cairn(['sessions', 'restore', id, snapshot.id])).code).toBe(0)
    expect(await notesOf(id)).toContain('The sky is blue')

    const fork = await json(['sessions', 'fork', id, snapshot.id, '--title', 'forked'])
    expect(fork).toMatchObject({ title: 'forked', agentName: 'notes' })
    expect(await notesOf(fork.id)).toContain('The sky is blue')
    expect((await json(['sessions', 'messages', fork.id])).length).toBe(2)

    const archive = path.join(work, 'ws.tar.gz')
    expect(await json(['sessions', 'export', id, '-o', archive])).toMatchObject({ path: archive })
    expect(execFileSync('tar', ['tzf', archive], { encoding: 'utf8' })).toContain('notes.md')
    const piped = await cairn(['sessions', 'export', id, '-o', '-'])
    expect(piped.stdout.length).toBeGreaterThan(0)

    // The export goes back in: the fork's workspace becomes the parent's, and says how to undo it.
    await cairn(['run', 'notes', '--session', fork.id, 'Only in the fork', '--single'])
    // The parent is back at the fork point (restored above): the merge would take the fork's notes.md.
    const preview = await cairn(['sessions', 'merge', fork.id.slice(0, 12), '--preview'])
    expect(preview.code, preview.stderr).toBe(0)
    expect(preview.stdout).toMatch(
      /^Would merge ses_[a-z0-9]{8} into ses_[a-z0-9]{8}: 1 change\(s\), 0 conflict/,
    )
    expect(preview.stdout).toContain('  update notes.md\n')
    const imported = await cairn(['sessions', 'import', fork.id, archive])
    expect(imported.code).toBe(0)
    expect(imported.stdout).toMatch(/^Imported \d+ entries \(.+\) into ses_[a-z0-9]{8}\n$/)
    expect(imported.stderr).toMatch(/cairn sessions restore ses_[a-z0-9]{8} snap_/)
    expect(await notesOf(fork.id)).not.toContain('Only in the fork')
    const merged = await json(['sessions', 'import', fork.id, archive, '--merge'])
    expect(merged).toMatchObject({ snapshot: { reason: 'before_import' } })
    expect((await cairn(['sessions', 'import', fork.id, path.join(work, 'absent.tar.gz')])).code).toBe(2)
    await writeFile(path.join(work, 'garbage.tar.gz'), 'not a tarball')
    const bad = await cairn(['sessions', 'import', fork.id, path.join(work, 'garbage.tar.gz'), '--json'])
    expect(bad.code).toBe(1)
    expect(JSON.parse(bad.stdout).error.code).toBe('invalid_archive')

    // Digests: the fork's import-time snapshot and the parent's live tree agree.
    const digested = await json(['sessions', 'snapshots', fork.id, '--digest'])
    expect(digested.every((s: { digest: unknown }) => /^sha256:[0-9a-f]{64}$/.test(String(s.digest)))).toBe(
      true,
    )
    expect((await cairn(['sessions', 'snapshots', fork.id, '--digest'])).stdout).toMatch(
      /Digest[\s\S]*sha256:/,
    )

    // Sizes: measured on request, shown as two columns.
    const sized = await json(['sessions', 'snapshots', fork.id, '--sizes'])
    expect(sized.every((s: { sizes: { referencedBytes: number } | null }) => s.sizes !== null)).toBe(true)
    expect((await cairn(['sessions', 'snapshots', fork.id, '--sizes'])).stdout).toMatch(
      /Referenced\s+Exclusive[\s\S]*\d+(\.\d)? (B|KB|MB)/,
    )

    // Deleting a snapshot: gone from the list; a second delete is not_found.
    const removed = await cairn(['sessions', 'snapshots', 'rm', id, snapshot.id])
    expect(removed.stdout).toBe(`Deleted snapshot ${snapshot.id}\n`)
    expect((await json(['sessions', 'snapshots', id])).map((s: { id: string }) => s.id)).not.toContain(
      snapshot.id,
    )
    const again = await cairn(['sessions', 'snapshots', 'rm', id, snapshot.id, '--json'])
    expect(again.code).toBe(1)
    expect(JSON.parse(again.stdout).error.code).toBe('not_found')
  })

  it('puts and gets files, with and without --json', async () => {
    const [record] = jsonLines(
      (await cairn(['run', 'notes', '--json', 'Files come and go', '--single'])).stdout,
    )
    const id = String(record?.sessionId).slice(0, 12)
    const dir = path.join(work, 'put-get')
    await mkdir(path.join(dir, 'down'), { recursive: true })
    const bytes = randomBytes(200_000)
    await writeFile(path.join(dir, 'blob.bin'), bytes)
    await writeFile(path.join(dir, 'hello.txt'), 'hello\n')

    // Default remote name: the local file's name, at the top of /workspace.
    const put = await cairn(['sessions', 'files', 'put', id, path.join(dir, 'hello.txt')])
    expect(put.code).toBe(0)
    expect(put.stdout).toBe(`Uploaded ${path.join(dir, 'hello.txt')} to ${id}:hello.txt (6 B)\n`)
    expect((await cairn(['sessions', 'cat', id, 'hello.txt'])).stdout).toBe('hello\n')
    // A path ending in / is a directory (created on the way); binary bytes survive as they are.
    expect(await json(['sessions', 'files', 'put', id, path.join(dir, 'blob.bin'), 'data/deep/'])).toEqual({
      ok: true,
      path: 'data/deep/blob.bin',
      bytes: bytes.length,
    })
    const piped = await cairn(['sessions', 'files', 'put', id, '-', 'notes/piped.md'], { input: '# piped\n' })
    expect(piped.stdout).toContain(`Uploaded stdin to ${id}:notes/piped.md (8 B)`)
    expect((await json(['sessions', 'files', id, 'data/deep'])).map((e: { name: string }) => e.name)).toEqual(
      ['blob.bin'],
    )

    const got = await cairn(['sessions', 'files', 'get', id, 'data/deep/blob.bin'], { cwd: dir })
    expect(got.code).toBe(0)
    expect(got.stdout).toBe('Wrote blob.bin (195.3 KB)\n')
    // (cwd is `dir`, where blob.bin was: it is now the downloaded copy)
    expect((await readFile(path.join(dir, 'blob.bin'))).equals(bytes)).toBe(true)
    expect(
      await json(['sessions', 'files', 'get', id, 'data/deep/blob.bin', path.join(dir, 'down')]),
    ).toEqual({
      path: 'data/deep/blob.bin',
      local: path.join(dir, 'down', 'blob.bin'),
      bytes: bytes.length,
    })
    expect((await readFile(path.join(dir, 'down', 'blob.bin'))).equals(bytes)).toBe(true)
    const renamed = path.join(dir, 'down', 'copy.md')
    expect((await cairn(['sessions', 'files', 'get', id, 'notes/piped.md', renamed])).code).toBe(0)
    expect(await readFile(renamed, 'utf8')).toBe('# piped\n')
    expect((await cairn(['sessions', 'files', 'get', id, 'hello.txt', '-'])).stdout).toBe('hello\n')

    // --snapshot reads the file as it was, wherever it is on the line.
    const snapshot = await json(['sessions', 'snapshot', id])
    await cairn(['sessions', 'files', 'put', id, '-', 'hello.txt'], { input: 'changed\n' })
    expect((await cairn(['sessions', 'files', 'get', id, 'hello.txt', '-'])).stdout).toBe('changed\n')
    expect(
      (await cairn(['sessions', 'files', 'get', id, 'hello.txt', '-', '--snapshot', snapshot.id])).stdout,
    ).toBe('hello\n')
    expect(
      (
        await cairn([
          'sessions',
          'files',
          'get',
          '--snapshot',
          snapshot.id.slice(5, 12),
          id,
          'hello.txt',
          '-',
        ])
      ).stdout,
    ).toBe('hello\n')

    const missing = await cairn(['sessions', 'files', 'get', id, 'nope.txt', path.join(dir, 'nope.txt')])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain('✗')
    expect((await cairn(['sessions', 'files', 'put', id, path.join(dir, 'absent.txt')])).code).toBe(2)
    expect((await cairn(['sessions', 'files', 'put', id, path.join(dir, 'down')])).code).toBe(2)
    expect((await cairn(['sessions', 'files', 'put', id, '-'], { input: 'x' })).code).toBe(2)
    expect(
      (await cairn(['sessions', 'files', 'put', id, path.join(dir, 'hello.txt'), '--snapshot', 'x'])).code,
    ).toBe(2)
    expect((await cairn(['sessions', 'files', 'get', id, 'hello.txt', '-', '--json'])).code).toBe(2)
    const noSession = await cairn([
      'sessions',
      'files',
      'put',
      'zzzzzz',
      path.join(dir, 'hello.txt'),
      '--json',
    ])
    expect(JSON.parse(noSession.stdout).error.code).toBe('session_not_found')
    await expect(readFile(path.join(dir, 'nope.txt'))).rejects.toThrow()
  })

  it('starts a session without automatic snapshots', async () => {
    const run = await cairn(['run', 'notes', '--no-auto-snapshots', '--json', 'No undo here', '--single'])
    expect(run.code).toBe(0)
    const id = String(jsonLines(run.stdout)[0]?.sessionId)
    expect(await json(['sessions', 'get', id])).toMatchObject({ id, autoSnapshots: false })
    expect((await cairn(['sessions', 'get', id])).stdout).toMatch(/^Auto snapshots: off$/m)
    expect(await json(['sessions', 'snapshots', id])).toEqual([])
    const [other] = jsonLines((await cairn(['run', 'notes', '--json', 'Undo here', '--single'])).stdout)
    expect((await cairn(['sessions', 'get', String(other?.sessionId)])).stdout).toMatch(
      /^Auto snapshots: on$/m,
    )
  })

  it('explains bad snapshot arguments', async () => {
    const [record] = jsonLines(
      (await cairn(['run', 'notes', '--json', 'x marks the spot', '--single'])).stdout,
    )
    const id = String(record?.sessionId)
    expect((await cairn(['sessions', 'restore', id])).code).toBe(2)
    const missing = await cairn(['sessions', 'restore', id, 'zzzz'])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain('✗ No snapshot of ses_')
    expect(missing.stderr).toContain('cairn sessions snapshots')
  })
})
