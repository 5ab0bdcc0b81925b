import { execFileSync } from 'node:child_process'
import { chmod, lstat, mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import * as tar from 'tar'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { EXAMPLES, startTestServer, type TestServer } from '../helpers/server.js'

/** Every entry under `dir` (the pool's own trees aside) with its permission bits. */
async function modes(dir: string, skip = new Set<string>()): Promise<Map<string, number>> {
  const found = new Map<string, number>()
  const walk = async (at: string) => {
    for (const name of await readdir(at)) {
      const full = path.join(at, name)
      if (skip.has(full)) continue
      const stat = await lstat(full)
      if (stat.isSymbolicLink()) continue
      found.set(path.relative(dir, full), stat.mode & 0o7777)
      if (stat.isDirectory()) await walk(full)
    }
  }
  found.set('.', (await lstat(dir)).mode & 0o7777)
  await walk(dir)
  return found
}

/** The entries that anyone but the owner may read, write or enter, or that carry a special bit. */
function notOwnerOnly(found: Map<string, number>): string[] {
  return [...found].filter(([, mode]) => (mode & 0o7077) !== 0).map(([p, m]) => `${p} ${m.toString(8)}`)
}

/** A tar.gz (made by GNU tar as root, so the modes are kept) of `files`: path → [mode, content]. */
async function tarWithModes(files: Record<string, [number, string | null]>): Promise<Buffer> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-modes-'))
  for (const [name, [, content]] of Object.entries(files)) {
    const full = path.join(dir, name)
    if (content === null) await mkdir(full, { recursive: true })
    else {
      await mkdir(path.dirname(full), { recursive: true })
      await writeFile(full, content)
    }
  }
  // Modes last, deepest first (a directory's own bits do not stop root).
  for (const [name, [mode]] of Object.entries(files).reverse()) await chmod(path.join(dir, name), mode)
  const archive = execFileSync('tar', ['-czf', '-', '-C', dir, '.'])
  await rm(dir, { recursive: true, force: true })
  return archive
}

describe('the data dir is the owner’s only', () => {
  it('after a first start, a deploy and a turn: 0700 directories, no file readable by others', async () => {
    // Made by hand beforehand, as an install script or `mkdir -p` would: 0755.
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-datadir-'))
    await chmod(dataDir, 0o755)
    const t = await startTestServer({ dataDir })
    try {
      expect((await t.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
      const session = await t.api.createSession('echo')
      expect((await t.api.send(session.id, 'hello')).terminal?.type).toBe('run.completed')
      const found = await modes(dataDir)
      expect(found.get('.')).toBe(0o700)
      // On PostgreSQL (CAIRN_TEST_DATABASE=postgres) the database is not in the data dir.
      const database = testsRunOnPostgres() ? [] : ['cairn.db']
      for (const name of [...database, 'pool.img', 'secret.key', 'admin.key'])
        expect(found.has(name)).toBe(true)
      expect(notOwnerOnly(found)).toEqual([])
    } finally {
      await t.close()
      await rm(dataDir, { recursive: true, force: true })
    }
  })

  it('fixes an install made with the old modes (0755 directories, 0644 files) at start-up', async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-datadir-'))
    const first = await startTestServer({ dataDir })
    expect((await first.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
    const key = first.key
    await first.close()
    for (const [rel, mode] of await modes(dataDir)) {
      const full = path.join(dataDir, rel)
      const isDir = (await lstat(full)).isDirectory()
      await chmod(full, isDir ? 0o755 : mode & 0o100 ? 0o755 : 0o644)
    }
    expect(notOwnerOnly(await modes(dataDir)).length).toBeGreaterThan(3)
    const again = await startTestServer({ dataDir })
    try {
      expect(again.server.adminKey).toBeUndefined()
      expect(
        (await fetch(`${again.url}/v1/agents`, { headers: { authorization: `Bearer ${key}` } })).status,
      ).toBe(200)
      expect(notOwnerOnly(await modes(dataDir))).toEqual([])
    } finally {
      await again.close()
      await rm(dataDir, { recursive: true, force: true })
    }
  })
})

describe('imported and deployed files lose setuid, setgid and meaningless sticky bits', () => {
  let t: TestServer
  beforeAll(async () => {
    t = await startTestServer()
    const project = await makeProject({
      'cairn.yaml': 'name: holder\ncommand: cat\n',
      'suid-tool': '#!/bin/sh\n',
    })
    await chmod(path.join(project, 'suid-tool'), 0o6755)
    expect((await t.api.deploy(project)).status).toBe(201)
  })
  afterAll(async () => {
    await t?.close()
  })

  const archiveFiles: Record<string, [number, string | null]> = {
    bin: [0o2775, null],
    'bin/suid': [0o4755, '#!/bin/sh\nid\n'],
    'bin/sgid': [0o2711, '#!/bin/sh\nid\n'],
    'sticky-file': [0o1644, 'x\n'],
    shared: [0o1777, null],
    'plain.sh': [0o755, '#!/bin/sh\n'],
  }
  const expected = {
    bin: 0o775,
    'bin/suid': 0o755,
    'bin/sgid': 0o711,
    'sticky-file': 0o644,
    // A directory's sticky bit means something (only owners delete): it stays.
    shared: 0o1777,
    'plain.sh': 0o755,
  }

  it.each(['replace', 'merge'])('PUT …/workspace?mode=%s', async (mode) => {
    const session = await t.api.createSession('holder')
    const archive = await tarWithModes(archiveFiles)
    const res = await t.api.call('PUT', `/v1/sessions/${session.id}/workspace?mode=${mode}`, archive)
    expect(res.status).toBe(200)
    const workspace = t.server.runtime.pool.workspacePath(session.id)
    const found = Object.fromEntries(
      await Promise.all(
        Object.keys(expected).map(async (name) => [
          name,
          (await lstat(path.join(workspace, name))).mode & 0o7777,
        ]),
      ),
    )
    expect(found).toEqual(expected)
  })

  it('a deploy archive (the files a new workspace starts from)', async () => {
    const session = await t.api.createSession('holder')
    const workspace = t.server.runtime.pool.workspacePath(session.id)
    expect((await lstat(path.join(workspace, 'suid-tool'))).mode & 0o7777).toBe(0o755)
  })

  it('an export: what the agent marked setuid in its workspace leaves without the bit', async () => {
    expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
    const session = await t.api.createSession('shell')
    const made = await t.api.send(
      session.id,
      'cp /bin/true suid && chmod 4755 suid && touch sticky && chmod 1644 sticky && mkdir sgid && chmod 2775 sgid && stat -c %a suid sticky sgid',
    )
    // The agent may mark its own files (nothing in its sandbox honours the bits: no_new_privs).
    expect(made.text).toBe('4755\n1644\n2775\n[exit 0]\n')
    for (const query of [
      '',
      `?snapshot=${(await t.api.call('POST', `/v1/sessions/${session.id}/snapshots`, {})).body.id}`,
    ]) {
      const res = await fetch(`${t.url}/v1/sessions/${session.id}/export${query}`, {
        headers: { authorization: `Bearer ${t.key}` },
      })
      expect(res.status).toBe(200)
      const archive = Buffer.from(await res.arrayBuffer())
      const found: Record<string, number> = {}
      const parser = new tar.Parser({
        onReadEntry: (entry) => {
          found[entry.path.replace(/^\.\//, '').replace(/\/$/, '')] = (entry.mode ?? 0) & 0o7777
          entry.resume()
        },
      })
      await pipeline(Readable.from([archive]), parser)
      expect({ suid: found.suid, sticky: found.sticky, sgid: found.sgid }).toEqual({
        suid: 0o755,
        sticky: 0o644,
        sgid: 0o775,
      })
    }
  })
})
