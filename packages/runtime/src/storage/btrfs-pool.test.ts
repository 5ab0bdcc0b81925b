import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { writeFile } from 'node:fs/promises'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  makeRevision,
  openTestRuntime,
  poolMounts,
  SANDBOX_UID,
  sessionId,
  type TestRuntime,
} from '../../test/harness.js'
import { BtrfsOps } from './btrfs-ops.js'

let t: TestRuntime

beforeAll(async () => {
  t = await openTestRuntime()
  await makeRevision(t.runtime, 'rev_base', {
    'README.md': '# project\n',
    'src/main.py': 'print("hi")\n',
  })
})

afterAll(async () => {
  const runtime = t.runtime
  await t.close()
  expect(poolMounts(runtime)).toBe(0)
})

function subvolumeShow(dir: string): Record<string, string> {
  const out = execFileSync('btrfs', ['subvolume', 'show', dir], { encoding: 'utf8' })
  const fields: Record<string, string> = {}
  for (const line of out.split('\n')) {
    const match = /^\s*([A-Za-z ]+):\s*(.*)$/.exec(line)
    if (match?.[1] && match[2] !== undefined) fields[match[1].trim()] = match[2].trim()
  }
  return fields
}

/** Runs python3 `code` with `args` as the sandbox uid on the host (no namespace, no filter). */
function asSandboxUid(code: string, ...args: string[]): string {
  return execFileSync(
    'setpriv',
    [
      '--reuid',
      String(SANDBOX_UID),
      '--regid',
      String(SANDBOX_UID),
      '--clear-groups',
      '/usr/bin/python3',
      '-c',
      code,
      ...args,
    ],
    { encoding: 'utf8' },
  ).trim()
}

describe('BtrfsPool', () => {
  it('mounts a btrfs filesystem at the pool root', () => {
    expect(poolMounts(t.runtime)).toBe(1)
    const fsType = execFileSync('stat', ['-f', '-c', '%T', t.runtime.pool.root], { encoding: 'utf8' }).trim()
    expect(fsType).toBe('btrfs')
  })

  it('seals a revision as a read-only subvolume owned by the sandbox uid', async () => {
    const rev = t.runtime.pool.revisionPath('rev_base')
    expect(await t.runtime.pool.hasRevision('rev_base')).toBe(true)
    expect(subvolumeShow(rev).Flags).toContain('readonly')
    expect(statSync(rev).uid).toBe(SANDBOX_UID)
    expect(statSync(path.join(rev, 'src/main.py')).uid).toBe(SANDBOX_UID)
    // Even root cannot write into a read-only subvolume.
    await expect(writeFile(path.join(rev, 'new.txt'), 'x')).rejects.toMatchObject({ code: 'EROFS' })
    await expect(writeFile(path.join(rev, 'README.md'), 'changed')).rejects.toMatchObject({ code: 'EROFS' })
    expect(readFileSync(path.join(rev, 'README.md'), 'utf8')).toBe('# project\n')
    // The staging subvolume is gone once sealed.
    expect(readdirSync(t.runtime.pool.areaDir('staging'))).toEqual([])
  })

  it('creates a workspace as a writable snapshot of the revision, owned by the sandbox uid', async () => {
    const id = sessionId('ws')
    const ws = await t.runtime.pool.createWorkspace(id, 'rev_base')
    expect(ws).toBe(t.runtime.pool.workspacePath(id))
    const info = statSync(ws)
    expect(info.uid).toBe(SANDBOX_UID)
    expect(info.gid).toBe(SANDBOX_UID)
    expect(info.mode & 0o777).toBe(0o700)
    expect(statSync(path.join(ws, 'src/main.py')).uid).toBe(SANDBOX_UID)
    const show = subvolumeShow(ws)
    expect(show.Flags).not.toContain('readonly')
    expect(show['Parent UUID']).toBe(subvolumeShow(t.runtime.pool.revisionPath('rev_base')).UUID)

    await writeFile(path.join(ws, 'README.md'), 'changed in the session\n')
    await writeFile(path.join(ws, 'new.txt'), 'new\n')
    expect(readFileSync(path.join(ws, 'README.md'), 'utf8')).toBe('changed in the session\n')
    // The revision does not see the session's writes.
    const rev = t.runtime.pool.revisionPath('rev_base')
    expect(readFileSync(path.join(rev, 'README.md'), 'utf8')).toBe('# project\n')
    expect(existsSync(path.join(rev, 'new.txt'))).toBe(false)
  })

  it('refuses to create a workspace twice', async () => {
    const id = sessionId('dup')
    await t.runtime.pool.createWorkspace(id, 'rev_base')
    await expect(t.runtime.pool.createWorkspace(id, 'rev_base')).rejects.toMatchObject({
      code: 'storage_error',
    })
  })

  it('fails with storage_error for a missing revision', async () => {
    await expect(t.runtime.pool.createWorkspace(sessionId('nr'), 'rev_missing')).rejects.toMatchObject({
      code: 'storage_error',
    })
  })

  it('rejects identifiers that could escape the pool', () => {
    for (const bad of ['../etc', 'ses_a/../../x', 'ses_', 'SES_ABC', 'ses_a b', '']) {
      expect(() => t.runtime.pool.workspacePath(bad), bad).toThrow(/invalid identifier/)
    }
  })

  it("answers a snapshotted workspace's change mark without the helper until a transaction begins on the pool", async () => {
    const pool = t.runtime.pool
    const id = sessionId('mark')
    const ws = await pool.createWorkspace(id, 'rev_base')
    // Nothing else may begin a transaction meanwhile: earlier writes are flushed (writeback would
    // begin one) and deleted subvolumes cleaned (in transactions of their own) first. Before the
    // cases that delete large trees, whose cleaning takes seconds.
    execFileSync('btrfs', ['filesystem', 'sync', pool.root])
    execFileSync('btrfs', ['subvolume', 'sync', pool.root])
    const mark = await pool.snapshotWorkspace(id, `snap_${id.slice(4)}`)
    expect(mark).toBeGreaterThan(0)
    const asked = pool.ops.helperRequests
    expect(asked).toBeGreaterThan(0)
    expect(await pool.workspaceMark(id)).toBe(mark)
    expect(pool.ops.helperRequests - asked).toBe(0)
    // A change elsewhere on the filesystem begins a transaction: the helper is asked again, and
    // the workspace's own mark has not moved.
    const other = await pool.createWorkspace(sessionId('markother'), 'rev_base')
    mkdirSync(path.join(other, 'made'))
    const before = pool.ops.helperRequests
    expect(await pool.workspaceMark(id)).toBe(mark)
    expect(pool.ops.helperRequests - before).toBe(1)
    // A change of the workspace's metadata alone (no data written) moves its mark.
    const again = await pool.snapshotWorkspace(id, `snap_${id.slice(4)}b`)
    mkdirSync(path.join(ws, 'made'))
    expect(await pool.workspaceMark(id)).toBeGreaterThan(again ?? Number.POSITIVE_INFINITY)
  })

  it('snapshots a revision of 10,000 files into a workspace', async () => {
    const staging = await t.runtime.pool.createStaging('rev_big')
    for (let d = 0; d < 100; d++) {
      const dir = path.join(staging, `d${d}`)
      execFileSync('mkdir', [dir])
      await Promise.all(
        Array.from({ length: 100 }, (_, f) => writeFile(path.join(dir, `f${f}.txt`), `${d}/${f}\n`)),
      )
    }
    await t.runtime.pool.sealRevision(staging, 'rev_big')
    const id = sessionId('big')
    const ws = await t.runtime.pool.createWorkspace(id, 'rev_big')
    let count = 0
    for (const dir of readdirSync(ws)) count += readdirSync(path.join(ws, dir)).length
    expect(count).toBe(10_000)
    expect(readFileSync(path.join(ws, 'd99/f99.txt'), 'utf8')).toBe('99/99\n')
    expect(statSync(path.join(ws, 'd42/f7.txt')).uid).toBe(SANDBOX_UID)
    expect(subvolumeShow(ws)['Parent UUID']).toBe(subvolumeShow(t.runtime.pool.revisionPath('rev_big')).UUID)
    await t.runtime.pool.deleteWorkspace(id)
    await t.runtime.pool.deleteRevision('rev_big')
    expect(await t.runtime.pool.hasRevision('rev_big')).toBe(false)
  })

  it('deletes a workspace and its subvolume', async () => {
    const id = sessionId('del')
    const ws = await t.runtime.pool.createWorkspace(id, 'rev_base')
    await writeFile(path.join(ws, 'data.bin'), Buffer.alloc(1024 * 1024, 1))
    expect(await t.runtime.pool.hasWorkspace(id)).toBe(true)
    await t.runtime.pool.deleteWorkspace(id)
    expect(await t.runtime.pool.hasWorkspace(id)).toBe(false)
    expect(existsSync(ws)).toBe(false)
    const list = execFileSync('btrfs', ['subvolume', 'list', t.runtime.pool.root], { encoding: 'utf8' })
    expect(list).not.toContain(id)
    // Deleting what is already gone is a no-op.
    await t.runtime.pool.deleteWorkspace(id)
  })

  it('deletes a workspace in which the agent created a nested subvolume', async () => {
    const id = sessionId('nest')
    const ws = await t.runtime.pool.createWorkspace(id, 'rev_base')
    execFileSync('btrfs', ['subvolume', 'create', path.join(ws, 'inner')])
    await writeFile(path.join(ws, 'inner', 'x'), 'x')
    await t.runtime.pool.deleteWorkspace(id)
    expect(existsSync(ws)).toBe(false)
  })

  it('lets only root destroy a subvolume: the sandbox uid cannot, even on one it owns (no user_subvol_rm_allowed)', async () => {
    // The super options of the pool's mount (after the " - " of its mountinfo line).
    const line = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .find((l) => l.split(' ')[4] === t.runtime.pool.root)
    expect(line?.split(' - ')[1]).not.toContain('user_subvol_rm_allowed')
    const id = sessionId('rmallowed')
    const ws = await t.runtime.pool.createWorkspace(id, 'rev_base')
    const inner = path.join(ws, 'inner')
    execFileSync('btrfs', ['subvolume', 'create', inner])
    execFileSync('chown', [`${SANDBOX_UID}:${SANDBOX_UID}`, inner])
    const innerId = Number(
      /Subvolume ID:\s+(\d+)/.exec(
        execFileSync('btrfs', ['subvolume', 'show', inner], { encoding: 'utf8' }),
      )?.[1],
    )
    // BTRFS_IOC_SNAP_DESTROY_V2 by id, as the sandbox uid on the host (no seccomp filter here), on
    // the workspace it owns: the seccomp rule's second wall.
    const destroy = [
      'import ctypes, fcntl, os, sys',
      'args = ctypes.create_string_buffer(4096)',
      'ctypes.c_uint64.from_buffer(args, 16).value = 1 << 4',
      'ctypes.c_uint64.from_buffer(args, 56).value = int(sys.argv[2])',
      'fd = os.open(sys.argv[1], os.O_RDONLY)',
      'try:\n    fcntl.ioctl(fd, 0x5000943F, args); print("destroyed")\nexcept OSError as e: print(e.strerror)',
    ].join('\n')
    const answer = asSandboxUid(destroy, ws, String(innerId))
    expect(answer).toBe('Operation not permitted')
    expect(existsSync(inner)).toBe(true)
    // The server (root) still removes the workspace and what is nested in it.
    await t.runtime.pool.deleteWorkspace(id)
    expect(existsSync(ws)).toBe(false)
  })

  it('swaps one workspace at a time: concurrent restores of a session each finish, and the workspace is one of them', async () => {
    const pool = t.runtime.pool
    const id = sessionId('swaps')
    const ws = await pool.createWorkspace(id, 'rev_base')
    const snapshots: string[] = []
    for (const n of [1, 2, 3, 4]) {
      await writeFile(path.join(ws, 'which.txt'), String(n))
      snapshots.push(`snap_${id.slice(4)}${n}`)
      await pool.snapshotWorkspace(id, snapshots.at(-1) as string)
    }
    // What a node meets when a restore and a recovery from the bucket (or two replicas'
    // recoveries) reach it at once: each swap made its new tree beside the workspace after
    // removing what was there, so one removed the other's half-made tree and a rename found
    // nothing: the workspace was left missing (a read then answered 500 state_lost).
    const results = await Promise.allSettled(
      snapshots.map((snapshotId, i) => pool.restoreWorkspace(id, snapshotId, 20 + i)),
    )
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'fulfilled'])
    expect(existsSync(ws)).toBe(true)
    expect(['1', '2', '3', '4']).toContain(readFileSync(path.join(ws, 'which.txt'), 'utf8'))
    expect(readdirSync(path.dirname(ws)).filter((name) => name.startsWith(`${path.basename(ws)}.`))).toEqual(
      [],
    )
    await pool.deleteWorkspace(id)
    for (const snapshotId of snapshots) await pool.deleteSnapshot(snapshotId)
  })

  it('keeps a generation marker inside each workspace: snapshots carry it, restores set it, the sandbox uid cannot touch it', async () => {
    const pool = t.runtime.pool
    const id = sessionId('gen')
    const ws = await pool.createWorkspace(id, 'rev_base')
    expect(await pool.readGenerations([id, sessionId('absent')])).toEqual([0, undefined])
    await pool.writeGeneration(id, 7)
    const snapshotId = `snap_${id.slice(4)}`
    await pool.snapshotWorkspace(id, snapshotId)
    await pool.writeGeneration(id, 9)
    const child = sessionId('genfork')
    await pool.forkWorkspace(child, snapshotId)
    expect(await pool.readGenerations([id, child])).toEqual([9, 7])
    await pool.restoreWorkspace(id, snapshotId, 10)
    expect(await pool.readGenerations([id])).toEqual([10])

    // Without the long-lived helpers (CAIRN_BTRFS_HELPER=off) the same operations run one by one.
    const previous = process.env.CAIRN_BTRFS_HELPER
    process.env.CAIRN_BTRFS_HELPER = 'off'
    try {
      const ops = new BtrfsOps(1)
      await ops.setGeneration(ws, 11)
      expect(await ops.getGenerations([ws, pool.workspacePath(child)])).toEqual([11, 7])
    } finally {
      if (previous === undefined) delete process.env.CAIRN_BTRFS_HELPER
      else process.env.CAIRN_BTRFS_HELPER = previous
    }

    // trusted.* attributes need CAP_SYS_ADMIN: the sandbox uid neither sees nor writes the marker.
    const asSandbox = (code: string) => asSandboxUid(code, ws)
    expect(
      asSandbox(
        'import os, sys\ntry:\n    os.getxattr(sys.argv[1], "trusted.cairn.generation"); print("read")\nexcept OSError as e: print(e.errno)',
      ),
    ).not.toBe('read')
    expect(
      asSandbox(
        'import os, sys\ntry:\n    os.setxattr(sys.argv[1], "trusted.cairn.generation", b"99"); print("wrote")\nexcept OSError as e: print(e.errno)',
      ),
    ).toBe('1')
    expect(await pool.readGenerations([id])).toEqual([11])
  })
})
