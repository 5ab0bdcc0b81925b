import { execFile } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdtemp, readdir, rm, statfs } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import { startServer } from '@cairn/server'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { testDatabaseFor } from './fixtures/test-database.mjs'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { Api, EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'
import { treeManifest } from './helpers/tree.js'

const BTRFS_MAGIC = 0x9123683e
const exec = promisify(execFile)

/** The same core flow on both workspace stores: what a user sees must not depend on the driver. */
describe.each(['btrfs', 'dir'] as const)('storage driver %s', (storage) => {
  let t: TestServer
  let dataDir: string

  beforeAll(async () => {
    // A plain directory under /tmp (ext4 here) holds the dir driver's trees.
    dataDir = await mkdtemp(path.join(os.tmpdir(), `cairn-storage-${storage}-`))
    t = await startTestServer({ dataDir, server: { storage } })
    expect((await t.api.deploy(`${EXAMPLES}/notes`)).status).toBe(201)
    const shell = await makeProject(SHELL_PROJECT)
    expect((await t.api.deploy(shell)).status).toBe(201)
  })

  afterAll(async () => {
    await t?.close()
    if (dataDir) await rm(dataDir, { recursive: true, force: true })
  })

  const run = async (id: string, command: string) => {
    const result = await t.api.send(id, command)
    expect(result.terminal?.type, JSON.stringify(result.events)).toBe('run.completed')
    return result.text
  }

  it('uses the store it was asked for', async () => {
    const { pool } = t.server.runtime
    expect(pool.driver).toBe(storage)
    expect(pool.capabilities.quotas).toBe(storage === 'btrfs')
    const fsType = (await statfs(pool.root)).type
    if (storage === 'btrfs') expect(fsType).toBe(BTRFS_MAGIC)
    else expect(fsType).not.toBe(BTRFS_MAGIC)
    const runtime = await t.api.call('GET', '/v1/runtime')
    expect(runtime.body.storage).toMatchObject({
      driver: storage,
      capabilities: { quotas: storage === 'btrfs', constantTimeCopies: storage === 'btrfs' },
    })
  })

  it('keeps workspaces and snapshots across a server restart', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo survives > kept.txt')
    const snap = (await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})).body.id as string
    await run(id, 'rm kept.txt')
    const key = t.key
    await t.server.close()
    const server = await startServer({
      dataDir,
      database: await testDatabaseFor(dataDir),
      port: 0,
      storage,
      writeCredentials: false,
      poolImageSizeBytes: 1024 * 1024 * 1024,
      logLevel: 'error',
    })
    t = { ...t, server, url: server.url, api: new Api(server.url, key), close: () => server.close() }
    expect((await t.api.call('POST', `/v1/sessions/${id}/restore`, { snapshotId: snap })).status).toBe(200)
    expect(await run(id, 'cat kept.txt')).toBe('survives\n[exit 0]\n')
  })

  it('runs an agent whose workspace keeps its notes across turns', async () => {
    const { id } = await t.api.createSession('notes')
    await run(id, 'The sky is blue')
    await run(id, 'Grass is green')
    const notes = await t.api.call('GET', `/v1/sessions/${id}/files/content?path=notes.md`)
    expect(notes.body).toContain('The sky is blue')
    expect(notes.body).toContain('Grass is green')
  })

  it('snapshots, restores an exact replica, undoes, forks, and deleting leaves nothing behind', async () => {
    const { pool } = t.server.runtime
    const { id } = await t.api.createSession('shell')
    await run(
      id,
      'mkdir -p src/deep ro && echo one > src/a.txt && echo two > src/deep/b.txt && chmod 640 src/a.txt && ln -s deep/b.txt src/link && ln src/a.txt hard && echo r > ro/f && chmod 555 ro',
    )
    const snap = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, { label: 'good' })
    expect(snap.status).toBe(201)
    const expected = await treeManifest(pool.snapshotPath(snap.body.id))
    expect(expected['src/link']).toBe('link 777 -> deep/b.txt')
    expect(expected.ro).toBe('dir 555')
    const digest = (await t.api.call('GET', `/v1/sessions/${id}/snapshots/${snap.body.id}?digest=true`)).body
      .digest

    await run(
      id,
      'echo changed > src/a.txt && chmod 777 src/a.txt && rm src/deep/b.txt src/link && ln -s /etc/passwd src/link && echo new > later.txt && chmod 755 ro && rm ro/f',
    )
    expect(
      (await t.api.call('POST', `/v1/sessions/${id}/restore`, { snapshotId: snap.body.id })).status,
    ).toBe(200)
    expect(await treeManifest(pool.workspacePath(id))).toEqual(expected)
    const again = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})
    expect(
      (await t.api.call('GET', `/v1/sessions/${id}/snapshots/${again.body.id}?digest=true`)).body.digest,
    ).toBe(digest)
    expect(await run(id, 'cat src/a.txt src/link; ls later.txt 2>&1 | grep -c "No such"')).toBe(
      'one\ntwo\n1\n[exit 0]\n',
    )

    await run(id, 'rm -r src')
    expect((await t.api.call('POST', `/v1/sessions/${id}/undo`)).status).toBe(200)
    expect(await run(id, 'cat src/a.txt')).toBe('one\n[exit 0]\n')

    const fork = await t.api.call('POST', `/v1/sessions/${id}/fork`, { snapshotId: snap.body.id })
    expect(fork.status).toBe(201)
    const child = fork.body.id as string
    expect(await treeManifest(pool.workspacePath(child))).toEqual(expected)
    await run(child, 'echo child > only-child.txt')
    await run(id, 'echo parent > only-parent.txt')
    expect(await run(child, 'ls only-*')).toBe('only-child.txt\n[exit 0]\n')
    expect(await run(id, 'ls only-*')).toBe('only-parent.txt\n[exit 0]\n')

    // Export, then import into a fresh session: the same tree.
    const exported = await fetch(`${t.url}/v1/sessions/${child}/export`, {
      headers: { authorization: `Bearer ${t.key}` },
    })
    const { id: fresh } = await t.api.createSession('shell')
    const imported = await t.api.call(
      'PUT',
      `/v1/sessions/${fresh}/workspace`,
      Buffer.from(await exported.arrayBuffer()),
    )
    expect(imported.status, JSON.stringify(imported.body)).toBe(200)
    expect(await treeManifest(pool.workspacePath(fresh))).toEqual(
      await treeManifest(pool.workspacePath(child)),
    )

    const sessions = [id, child, fresh]
    const snapshots: string[] = []
    for (const s of sessions) {
      for (const info of (await t.api.call('GET', `/v1/sessions/${s}/snapshots`)).body.data)
        snapshots.push(info.id)
    }
    expect(snapshots.length).toBeGreaterThan(5)
    for (const s of sessions) expect((await t.api.call('DELETE', `/v1/sessions/${s}`)).status).toBe(200)
    for (const s of sessions) expect(existsSync(pool.workspacePath(s))).toBe(false)
    for (const s of snapshots) expect(existsSync(pool.snapshotPath(s))).toBe(false)
    // Nothing of theirs anywhere in the pool, hidden copies included.
    for (const area of ['sessions', 'snapshots', 'staging'] as const) {
      const left = await readdir(pool.areaDir(area))
      for (const s of [...sessions, ...snapshots])
        expect(left.filter((name) => name.includes(s.slice(s.indexOf('_') + 1)))).toEqual([])
    }
  })

  it("keeps a generation marker in the workspace: an import and a restore move it forward, a workspace put back behind Cairn's back is refused", async () => {
    const { pool } = t.server.runtime
    const { id } = await t.api.createSession('shell', { autoSnapshots: false, keepWarmMs: 0 })
    const generation = async () => (await t.api.call('GET', `/v1/sessions/${id}`)).body.generation as number
    await run(id, 'echo one > one.txt')
    const snap = (await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})).body.id as string
    const atSnapshot = await generation()
    expect(atSnapshot).toBeGreaterThan(0)
    expect(await pool.readGenerations([id])).toEqual([atSnapshot])

    // An import replaces the workspace: a new generation, on disk as in the database.
    const exported = await fetch(`${t.url}/v1/sessions/${id}/export`, {
      headers: { authorization: `Bearer ${t.key}` },
    })
    const archive = Buffer.from(await exported.arrayBuffer())
    expect((await t.api.call('PUT', `/v1/sessions/${id}/workspace`, archive)).status).toBe(200)
    const afterImport = await generation()
    expect(afterImport).toBeGreaterThan(atSnapshot)
    expect(await pool.readGenerations([id])).toEqual([afterImport])

    // The snapshot's copy put back in place outside Cairn carries its older marker.
    const workspace = pool.workspacePath(id)
    if (storage === 'btrfs') {
      await exec('btrfs', ['subvolume', 'delete', workspace])
      await exec('btrfs', ['subvolume', 'snapshot', pool.snapshotPath(snap), workspace])
    } else {
      await rm(workspace, { recursive: true, force: true })
      await exec('cp', ['-a', '--no-target-directory', pool.snapshotPath(snap), workspace])
    }
    const refused = await t.api.send(id, 'cat one.txt')
    expect(refused.body).toMatchObject({
      error: {
        code: 'state_lost',
        details: { workspaceGeneration: atSnapshot, recordedGeneration: afterImport },
      },
    })

    // A restore writes a newer generation into the restored copy before the database records it.
    expect((await t.api.call('POST', `/v1/sessions/${id}/restore`, { snapshotId: snap })).status).toBe(200)
    const afterRestore = await generation()
    expect(afterRestore).toBeGreaterThan(afterImport)
    expect(await pool.readGenerations([id])).toEqual([afterRestore])
    expect(await run(id, 'cat one.txt')).toBe('one\n[exit 0]\n')
    expect((await t.api.call('DELETE', `/v1/sessions/${id}`)).status).toBe(200)
  })

  it('measures snapshot and workspace sizes on request, exclusive bytes as they change', async () => {
    const MiB = 1024 * 1024
    const { id } = await t.api.createSession('shell', { autoSnapshots: false })
    const take = async () => (await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})).body.id as string
    const sizesOf = async (snapId: string) => {
      const res = await t.api.call('GET', `/v1/sessions/${id}/snapshots/${snapId}?sizes=true`)
      expect(res.status, JSON.stringify(res.body)).toBe(200)
      return res.body.sizes as { referencedBytes: number; exclusiveBytes: number }
    }
    await run(id, 'head -c 1048576 /dev/urandom > one.bin')
    const a = await take()
    await run(id, 'head -c 2097152 /dev/urandom > two.bin')
    const b = await take()

    // Not measured unless asked for.
    expect((await t.api.call('GET', `/v1/sessions/${id}/snapshots/${a}`)).body.sizes).toBeNull()
    const sizesA = await sizesOf(a)
    expect(sizesA.referencedBytes).toBeGreaterThanOrEqual(MiB)
    expect(sizesA.referencedBytes).toBeLessThan(2 * MiB)
    expect((await sizesOf(b)).referencedBytes).toBeGreaterThanOrEqual(3 * MiB)

    // The 2 MiB file leaves the workspace: now only B holds it.
    await run(id, 'rm two.bin')
    const listed = (await t.api.call('GET', `/v1/sessions/${id}/snapshots?sizes=true`)).body.data as {
      id: string
      sizes: { referencedBytes: number; exclusiveBytes: number }
    }[]
    const sizesB = listed.find((s) => s.id === b)?.sizes
    expect(sizesB?.exclusiveBytes).toBeGreaterThanOrEqual(2 * MiB)
    expect(sizesB?.referencedBytes).toBeGreaterThanOrEqual(3 * MiB)

    const manifest = (await t.api.call('GET', `/v1/sessions/${id}/manifest?sizes=true`)).body
    expect(manifest.workspaceSizes.referencedBytes).toBeGreaterThanOrEqual(MiB)
    expect(manifest.workspaceSizes.referencedBytes).toBeLessThan(2 * MiB)
    expect((await t.api.call('GET', `/v1/sessions/${id}/manifest`)).body.workspaceSizes).toBeNull()
    expect((await t.api.call('DELETE', `/v1/sessions/${id}`)).status).toBe(200)
  })

  if (storage === 'dir') {
    it('refuses workspace quotas, which only btrfs can enforce', async () => {
      const quotaDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-storage-quota-'))
      try {
        await expect(
          startServer({
            dataDir: quotaDir,
            port: 0,
            storage: 'dir',
            workspaceQuotaMiB: 16,
            writeCredentials: false,
            logLevel: 'silent',
          }),
        ).rejects.toMatchObject({ code: 'unavailable', message: expect.stringContaining('btrfs') })
      } finally {
        await rm(quotaDir, { recursive: true, force: true })
      }
    })

    it('keeps snapshots where no sandbox can reach them', async () => {
      const { pool } = t.server.runtime
      const mode = (await import('node:fs')).statSync(pool.areaDir('snapshots')).mode & 0o777
      expect(mode).toBe(0o700)
    })
  }
})
