import { execFileSync } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, type CliOptions, jsonLines, spawnCli } from './helpers/cli.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
let work: string
let env: Record<string, string>

const cairn = (args: string[], options: CliOptions = {}) => spawnCli(args, env, options).done
const json = async (args: string[], options: CliOptions = {}) => {
  const r = await cairn([...args, '--json'], options)
  expect(r.stderr).not.toContain('✗')
  expect(r.code).toBe(0)
  return JSON.parse(r.stdout)
}
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
