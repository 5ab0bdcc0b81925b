import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdir, mkdtemp, rm, unlink, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { POOL_BYTES, SANDBOX_UID } from '../../test/harness.js'
import { readMounts } from '../util/mounts.js'
import { BtrfsPool, tenantQgroup } from './btrfs-pool.js'
import { DirPool } from './dir-pool.js'
import type { StoragePool } from './pool.js'

const MiB = 1024 * 1024

type Setup = 'btrfs' | 'btrfs with qgroups' | 'dir'

function makePool(setup: Setup, dataDir: string): StoragePool {
  const common = { mountPoint: path.join(dataDir, 'mnt'), sandboxUid: SANDBOX_UID, sandboxGid: SANDBOX_UID }
  if (setup === 'dir') return new DirPool({ ...common, storePath: path.join(dataDir, 'store') })
  return new BtrfsPool({
    ...common,
    imagePath: path.join(dataDir, 'pool.img'),
    imageSizeBytes: POOL_BYTES,
    workspaceQuotaBytes: setup === 'btrfs with qgroups' ? 64 * MiB : undefined,
  })
}

/** The figures `btrfs qgroup show` gives for a subvolume (after a sync). */
function qgroupOf(dir: string): { referencedBytes: number; exclusiveBytes: number } {
  const out = execFileSync('btrfs', ['qgroup', 'show', '--raw', '--sync', '-f', dir], { encoding: 'utf8' })
  const match = /^0\/\d+\s+(\d+)\s+(\d+)/m.exec(out)
  return { referencedBytes: Number(match?.[1]), exclusiveBytes: Number(match?.[2]) }
}

describe.each<Setup>(['btrfs', 'btrfs with qgroups', 'dir'])('StoragePool.usage (%s)', (setup) => {
  let dataDir: string
  let pool: StoragePool

  beforeAll(async () => {
    dataDir = await mkdtemp(path.join(tmpdir(), 'cairn-usage-'))
    pool = makePool(setup, dataDir)
    await pool.open()
    const staging = await pool.createStaging('rev_usage')
    await writeFile(path.join(staging, 'README.md'), '# project\n')
    await pool.sealRevision(staging, 'rev_usage')
  })

  afterAll(async () => {
    await pool?.close()
    expect(readMounts().filter((m) => m.mountPoint === pool.root)).toEqual([])
    if (dataDir) await rm(dataDir, { recursive: true, force: true })
  })

  it('measures referenced and exclusive bytes of snapshots as the workspace changes', async () => {
    const ws = await pool.createWorkspace('ses_usage', 'rev_usage')
    await writeFile(path.join(ws, 'one.bin'), randomBytes(MiB))
    await pool.snapshotWorkspace('ses_usage', 'snp_usagea')
    await writeFile(path.join(ws, 'two.bin'), randomBytes(2 * MiB))
    await pool.snapshotWorkspace('ses_usage', 'snp_usageb')
    const a = await pool.usage(pool.snapshotPath('snp_usagea'))
    const b = await pool.usage(pool.snapshotPath('snp_usageb'))
    expect(a.referencedBytes).toBeGreaterThanOrEqual(MiB)
    expect(a.referencedBytes).toBeLessThan(2 * MiB)
    expect(b.referencedBytes).toBeGreaterThanOrEqual(3 * MiB)
    expect(b.referencedBytes).toBeLessThan(4 * MiB)
    if (setup !== 'dir') {
      // Everything B holds is still in the workspace: deleting B alone would free (almost) nothing.
      expect(b.exclusiveBytes).toBeLessThan(MiB)
    }

    // Once the workspace drops the 2 MiB file, only B holds it.
    await unlink(path.join(ws, 'two.bin'))
    const after = await pool.usage(pool.snapshotPath('snp_usageb'))
    expect(after.exclusiveBytes).toBeGreaterThanOrEqual(2 * MiB)
    expect(after.referencedBytes).toBe(b.referencedBytes)
    const live = await pool.usage(ws)
    expect(live.referencedBytes).toBeGreaterThanOrEqual(MiB)
    expect(live.referencedBytes).toBeLessThan(2 * MiB)

    if (setup === 'btrfs with qgroups') {
      // Simple quotas count what a tree wrote (a snapshot wrote nothing), not what it holds: the
      // sizes come from a walk of its extents, never from its quota group.
      expect(pool.quotaStatus().accounting).toBe('simple')
      expect(qgroupOf(pool.snapshotPath('snp_usageb')).referencedBytes).toBeLessThan(MiB)
    }
    if (setup === 'dir') {
      // Plain copies share nothing that can be told apart: both figures are the tree's blocks.
      expect(after.exclusiveBytes).toBe(after.referencedBytes)
    }
  })

  it.runIf(setup === 'btrfs with qgroups')(
    "reads a tenant's figures group by group from the kernel: what `btrfs qgroup show` lists for its group, without running it",
    async () => {
      const ws = await pool.createWorkspace('ses_tenant', 'rev_usage', 'ten_usage')
      await writeFile(path.join(ws, 'one.bin'), randomBytes(MiB))
      execFileSync('btrfs', ['filesystem', 'sync', ws])
      const listed = execFileSync('btrfs', ['qgroup', 'show', '--raw', pool.root], { encoding: 'utf8' })
      const row = listed.split('\n').find((line) => line.startsWith(`${tenantQgroup('ten_usage')} `))
      const [, referenced, exclusive] = row?.trim().split(/\s+/) ?? []
      const expected = { referencedBytes: Number(referenced), exclusiveBytes: Number(exclusive) }
      expect(expected.exclusiveBytes).toBeGreaterThanOrEqual(MiB)
      // Listing every group (two ioctls a tree) made each storage reservation grow with the trees
      // held: with no `btrfs` on the PATH the figures still come, so none is listed.
      const noTools = path.join(dataDir, 'no-tools')
      await mkdir(noTools, { recursive: true })
      const pathBefore = process.env.PATH
      process.env.PATH = noTools
      try {
        const usage = await pool.tenantUsage(['ten_usage', 'ten_without_trees'])
        expect(Object.fromEntries(usage)).toEqual({ ten_usage: expected })
      } finally {
        process.env.PATH = pathBefore
      }
    },
  )
})
