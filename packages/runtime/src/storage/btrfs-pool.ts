import { createHash } from 'node:crypto'
import { existsSync } from 'node:fs'
import { chmod, mkdir, stat, statfs } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { execTool } from '../util/exec.js'
import { findMount } from '../util/mounts.js'
import { CommitRequester } from './btrfs-commit.js'
import { BtrfsOps, type QuotaPlacement } from './btrfs-ops.js'
import { extentUsage } from './extent-usage.js'
import {
  type ImagesUsage,
  POOL_AREAS,
  type PoolQuotaStatus,
  type StoragePool,
  type StoragePoolOptions,
  safeName,
  type TreeSizes,
} from './pool.js'
import { PoolLayout } from './pool-layout.js'
import { poolTrees, showQgroups, unownedTrees } from './pool-owners.js'
import { QgroupSysfs } from './qgroup-sysfs.js'
import { removeTree } from './remove-tree.js'

const BTRFS_MAGIC = 0x9123683e
/** Every subvolume's root directory has this inode number. */
const SUBVOLUME_ROOT_INO = 256
/** The level-2 qgroup holding every tenant's group: capped at the pool's size less the reserve. */
const AGENTS_QGROUP = '2/1'
/**
 * The level-1 qgroup of the shared agent images, a member of the agents' group: its id is above
 * every tenant's (`tenantQgroup` hashes to 1 … 2^40), so no tenant can share it.
 */
export const IMAGES_QGROUP = `1/${2 ** 40 + 1}`
const MiB = 1024 * 1024

/** The reserve when none is configured: 5% of the pool, at least 16 MiB, at most 2 GiB. */
export function defaultReserveBytes(totalBytes: number): number {
  return Math.min(2048 * MiB, Math.max(16 * MiB, Math.round(totalBytes * 0.05)))
}

/**
 * The level-1 qgroup of a tenant (`1/<n>`): 40 bits of SHA-256 of its ID, so every process finds
 * the same group without storing a mapping (trees of no tenant hash the empty string). Two
 * tenants would share a group only on a 40-bit collision (about 1 in 10^5 for 5,000 tenants).
 */
export function tenantQgroup(tenantId: string | undefined): string {
  const digest = createHash('sha256')
    .update(tenantId ?? '')
    .digest()
  return `1/${digest.readUIntBE(0, 5) + 1}`
}

/**
 * The offenders against "no tree in the pool without a limited owner" in the btrfs pool mounted at
 * `mountPoint` whose tenant groups are limited to `tenantQuotaBytes` (undefined: tenants' groups
 * have no limit of their own, the agents' group bounds them): see `unownedTrees`.
 */
export async function unownedPoolTrees(mountPoint: string, tenantQuotaBytes: number | undefined) {
  const { trees, groups } = await poolTrees(mountPoint)
  const named = { agents: AGENTS_QGROUP, images: IMAGES_QGROUP, noTenant: tenantQgroup(undefined) }
  return unownedTrees(trees, groups, { ...named, tenantQuotaBytes })
}

export interface BtrfsPoolOptions extends StoragePoolOptions {
  /** Sparse image file to create and loop-mount when `existingPath` is not given. */
  imagePath: string
  imageSizeBytes: number
  /** Use this existing btrfs directory instead of an image (bind-mounted at `mountPoint`). */
  existingPath?: string | undefined
}

/**
 * The workspace store: one btrfs filesystem holding revisions (read-only subvolumes), session
 * workspaces (writable snapshots of a revision) and snapshots. Every operation is a subvolume
 * operation, so creating a session costs the same whatever the size of the project.
 */
export class BtrfsPool extends PoolLayout implements StoragePool {
  readonly driver = 'btrfs'
  readonly capabilities = { quotas: true, constantTimeCopies: true }
  /** Whether quota groups are on (undefined: not asked yet). */
  private qgroups: boolean | undefined
  /** Whether this pool places its trees in tenant qgroups and enforces limits (any limit set). */
  private readonly enforcing: boolean
  /** Tenant groups made (or found) by this process, with their limit applied. */
  private readonly tenantGroups = new Map<string, Promise<string>>()
  private status: PoolQuotaStatus = { enforced: false }
  /** Simple quotas (kernel 6.7+; O(1) snapshots and writes) or full qgroups (older kernels, older pools). */
  private quotaMode: 'squota' | 'qgroup' | undefined
  /** The groups' figures one at a time (sysfs); undefined: listed with `btrfs qgroup show` instead. */
  private sysfs: QgroupSysfs | undefined
  readonly ops = new BtrfsOps()
  /** Commits asked for after deletions, so a tenant at its limit gets the space back at once. */
  private readonly commits: CommitRequester

  constructor(private readonly options: BtrfsPoolOptions) {
    super(options)
    this.commits = new CommitRequester(options.mountPoint)
    const { workspaceQuotaBytes, tenantQuotaBytes, reserveBytes } = options
    // Any limit turns qgroups on (they cost every snapshot a little); with them the reserve always holds.
    this.enforcing = Boolean(
      workspaceQuotaBytes || tenantQuotaBytes || reserveBytes || options.imagesQuotaBytes,
    )
  }

  describe(): string {
    const quotas = this.quotaMode === 'squota' ? ' (simple quotas)' : ' (qgroup quotas)'
    return `btrfs pool at ${this.options.mountPoint}${this.enforcing ? quotas : ''}`
  }

  quotaStatus(): PoolQuotaStatus {
    return this.status
  }

  async open(): Promise<void> {
    const { mountPoint, existingPath, imagePath, imageSizeBytes } = this.options
    await mkdir(mountPoint, { recursive: true })
    const mounted = findMount(mountPoint)
    if (mounted) {
      if (mounted.fsType !== 'btrfs') {
        throw new CairnProblem(
          'storage_error',
          `${mountPoint} is mounted but is ${mounted.fsType}, not btrfs`,
        )
      }
    } else if (existingPath) {
      const fs = await statfs(existingPath)
      if (fs.type !== BTRFS_MAGIC) {
        throw new CairnProblem('storage_error', `${existingPath} is not on a btrfs filesystem`)
      }
      await execTool('mount', ['--bind', existingPath, mountPoint], { code: 'storage_error' })
      this.mountedHere = true
    } else {
      await mkdir(path.dirname(imagePath), { recursive: true })
      if (!existsSync(imagePath)) {
        await execTool('truncate', ['-s', String(imageSizeBytes), imagePath], { code: 'storage_error' })
        await execTool('mkfs.btrfs', ['-q', '-L', 'cairn', imagePath], { code: 'storage_error' })
      }
      await execTool('mount', ['-o', 'loop,noatime', imagePath, mountPoint], {
        code: 'storage_error',
      })
      this.mountedHere = true
    }
    await chmod(mountPoint, 0o711)
    if (this.enforcing) await this.enableQuotas()
    for (const area of POOL_AREAS) {
      await mkdir(this.areaDir(area), { recursive: true })
      await chmod(this.areaDir(area), 0o711)
    }
  }

  /**
   * Turns quota groups on and caps the agents' group (2/1, parent of every tenant's group) at the
   * pool's size less the reserve, so agents together never take the space Cairn's own writes need.
   */
  private async enableQuotas(): Promise<void> {
    const { mountPoint, workspaceQuotaBytes, tenantQuotaBytes } = this.options
    this.quotaMode = await this.ops.enableQuotas(mountPoint)
    this.qgroups = true
    // Without the sysfs figures (a kernel before 5.9) every read lists the groups, as before.
    this.sysfs = await this.ops
      .sysfsDir(mountPoint)
      .then((dir) => QgroupSysfs.at(dir))
      .catch(() => undefined)
    const { totalBytes, freeBytes } = await this.poolStats()
    const reserveBytes = this.options.reserveBytes || defaultReserveBytes(totalBytes)
    if (reserveBytes >= totalBytes) {
      throw new CairnProblem(
        'validation_failed',
        `the pool reserve (${reserveBytes} bytes) must be smaller than the pool (${totalBytes} bytes)`,
      )
    }
    await this.qgroupCommand(['create', AGENTS_QGROUP, mountPoint], /exist/i)
    // What agents hold now plus what is free beyond the reserve: the pool's own overhead
    // (metadata copies, the trees of no subvolume) is already out of the free figure.
    const agentsUsedBytes = (await this.qgroupFigures(AGENTS_QGROUP))?.exclusiveBytes ?? 0
    const agentsTotalBytes = agentsUsedBytes + Math.max(0, freeBytes - reserveBytes)
    await this.qgroupCommand(['limit', '-e', String(agentsTotalBytes), AGENTS_QGROUP, mountPoint])
    const imagesBytes = this.options.imagesQuotaBytes || Math.floor(agentsTotalBytes / 2)
    await this.qgroupCommand(['create', IMAGES_QGROUP, mountPoint], /exist/i)
    await this.qgroupCommand(['assign', '--no-rescan', IMAGES_QGROUP, AGENTS_QGROUP, mountPoint], /exist/i)
    await this.qgroupCommand(['limit', '-e', String(imagesBytes), IMAGES_QGROUP, mountPoint])
    await this.adoptImages()
    this.status = {
      enforced: true,
      accounting: this.quotaMode === 'squota' ? 'simple' : 'full',
      workspaceBytes: workspaceQuotaBytes,
      tenantBytes: tenantQuotaBytes,
      reserveBytes,
      agentsTotalBytes,
      imagesBytes,
      ...(await this.rescanIfInconsistent()),
    }
  }

  /**
   * Images built before the images' group was capped were made in no group: they join it (the
   * figures are then rescanned, below), so no tree of the pool is without a limited owner.
   */
  private async adoptImages(): Promise<void> {
    const { trees } = await poolTrees(this.options.mountPoint)
    for (const tree of trees) {
      if (tree.owner || !/^images\/[^/]+$/.test(tree.path)) continue
      await this.qgroupCommand(
        ['assign', '--no-rescan', tree.qgroup, IMAGES_QGROUP, this.options.mountPoint],
        /exist/i,
      )
    }
  }

  /**
   * Makes `target` a copy of the received subvolume `received` keeping its received UUID (see
   * `BtrfsOps.adoptReceived`), in the tenant's group like every tree of the tenant's.
   */
  async adoptReceived(received: string, target: string, tenantId: string | undefined): Promise<void> {
    await this.ops.adoptReceived(received, target, await this.placement(tenantId, false))
  }

  /**
   * The trees that break "no tree in the pool without a limited owner" (`unownedTrees`), each
   * named with what is wrong; none on a pool that enforces no quota.
   */
  async unownedTrees(): Promise<string[]> {
    if (!this.enforcing) return []
    return unownedPoolTrees(this.options.mountPoint, this.options.tenantQuotaBytes || undefined)
  }

  /**
   * Figures the kernel marked inconsistent (qgroups just enabled on a pool that had data, trees
   * made outside any tenant group, or a kernel without the quick inherit of snapshots into their
   * source's group, before 6.8) are still enforced, but may be off: a rescan is started in the
   * background and operators are told.
   */
  private async rescanIfInconsistent(): Promise<Pick<PoolQuotaStatus, 'warning'>> {
    const inconsistent = this.sysfs
      ? this.sysfs.inconsistent()
      : /inconsistent/i.test((await showQgroups(['--raw', this.options.mountPoint])).stderr)
    if (!inconsistent) return {}
    await execTool('btrfs', ['quota', 'rescan', this.options.mountPoint], { code: 'storage_error' }).catch(
      () => undefined,
    )
    return {
      warning: {
        code: 'quotas_inexact',
        message:
          "the pool's quota figures were marked inconsistent: a rescan was started; until it ends, limits are enforced against figures that may be off",
      },
    }
  }

  /** One qgroup's figures, after a sync (undefined: no such group). */
  private async qgroupFigures(group: string): Promise<TreeSizes | undefined> {
    if (this.sysfs) {
      await execTool('btrfs', ['filesystem', 'sync', this.options.mountPoint], { code: 'storage_error' })
      return this.sysfs.figures(group)
    }
    const { stdout } = await showQgroups(['--raw', '--sync', this.options.mountPoint])
    for (const line of stdout.split('\n')) {
      const [id, referenced, exclusive] = line.trim().split(/\s+/)
      if (id === group) return { referencedBytes: Number(referenced), exclusiveBytes: Number(exclusive) }
    }
    return undefined
  }

  private async qgroupCommand(args: string[], tolerated?: RegExp): Promise<void> {
    await execTool('btrfs', ['qgroup', ...args], { code: 'storage_error' }).catch((error: Error) => {
      if (!tolerated?.test(error.message)) throw error
    })
  }

  /**
   * The tenant's level-1 group, made on first use by this process: a member of the agents' group,
   * capped at the tenant quota (exclusive bytes: what the tenant's trees alone hold). A limit
   * changed in the configuration applies from the next start.
   */
  private tenantGroup(tenantId: string | undefined): Promise<string> {
    const key = tenantId ?? ''
    let made = this.tenantGroups.get(key)
    if (!made) {
      const group = tenantQgroup(tenantId)
      const { mountPoint, tenantQuotaBytes } = this.options
      made = (async () => {
        await this.qgroupCommand(['create', group, mountPoint], /exist/i)
        await this.qgroupCommand(['assign', '--no-rescan', group, AGENTS_QGROUP, mountPoint], /exist/i)
        const limit = tenantQuotaBytes && tenantId !== undefined ? String(tenantQuotaBytes) : 'none'
        await this.qgroupCommand(['limit', '-e', limit, group, mountPoint])
        return group
      })()
      made.catch(() => this.tenantGroups.delete(key))
      this.tenantGroups.set(key, made)
    }
    return made
  }

  /**
   * Where a new tree counts: in its tenant's group (every tree of a tenant, so snapshots and the
   * trees they share data with stay in one group and the kernel keeps the figures exact without a
   * rescan), and, for a writable workspace, under the workspace limit.
   */
  private async placement(tenantId: string | undefined, workspace: boolean): Promise<QuotaPlacement> {
    if (!this.enforcing) return {}
    return {
      qgroup: await this.tenantGroup(tenantId),
      ...(workspace && this.options.workspaceQuotaBytes
        ? { maxReferencedBytes: this.options.workspaceQuotaBytes }
        : {}),
    }
  }

  /**
   * The tenants' groups' figures (exclusive bytes: what their trees alone hold), as the kernel
   * counts them now: read group by group where sysfs has them, so a storage reservation costs the
   * same whatever the number of trees in the pool.
   */
  async tenantUsage(tenantIds: string[]): Promise<Map<string, TreeSizes>> {
    const found = new Map<string, TreeSizes>()
    if (!this.enforcing || tenantIds.length === 0) return found
    const sysfs = this.sysfs
    if (sysfs) {
      for (const tenantId of tenantIds) {
        const sizes = sysfs.figures(tenantQgroup(tenantId))
        if (sizes) found.set(tenantId, sizes)
      }
      return found
    }
    const { stdout } = await showQgroups(['--raw', this.options.mountPoint])
    const byGroup = new Map<string, TreeSizes>()
    for (const line of stdout.split('\n')) {
      const match = /^(1\/\d+)\s+(\d+)\s+(\d+)/.exec(line.trim())
      if (match?.[1])
        byGroup.set(match[1], { referencedBytes: Number(match[2]), exclusiveBytes: Number(match[3]) })
    }
    for (const tenantId of tenantIds) {
      const sizes = byGroup.get(tenantQgroup(tenantId))
      if (sizes) found.set(tenantId, sizes)
    }
    return found
  }

  async close(): Promise<void> {
    this.ops.close()
    await this.commits.settled()
    await this.unmount()
  }

  /** A fresh writable subvolume in staging, to be filled and then sealed as a revision. */
  async createStaging(name: string, tenantId?: string): Promise<string> {
    const dir = path.join(this.areaDir('staging'), safeName(name))
    await this.deleteSubvolume(dir)
    await this.ops.create(dir, await this.placement(tenantId, false))
    return dir
  }

  /** Seals a filled staging subvolume as a read-only revision owned by the sandbox uid. */
  async sealRevision(stagingDir: string, revisionId: string, tenantId?: string): Promise<string> {
    const target = this.revisionPath(revisionId)
    await this.handToSandbox(stagingDir)
    await this.ops.snapshot(stagingDir, target, true, await this.placement(tenantId, false))
    await this.deleteSubvolume(stagingDir)
    return target
  }

  async discardStaging(stagingDir: string): Promise<void> {
    await this.deleteSubvolume(stagingDir)
  }

  /** An image's staging tree, in the images' group (its limit stops a build that would pass it). */
  async createImageStaging(name: string): Promise<string> {
    const dir = path.join(this.areaDir('staging'), safeName(name))
    await this.deleteSubvolume(dir)
    await this.ops.create(dir, this.enforcing ? { qgroup: IMAGES_QGROUP } : {})
    return dir
  }

  async sealImageStaging(stagingDir: string, target: string): Promise<void> {
    await this.ops.snapshot(stagingDir, target, true, this.enforcing ? { qgroup: IMAGES_QGROUP } : {})
    await this.deleteSubvolume(stagingDir)
  }

  async imagesUsage(): Promise<ImagesUsage | undefined> {
    const quotaBytes = this.status.imagesBytes
    if (!this.enforcing || quotaBytes === undefined) return undefined
    const usedBytes = (await this.qgroupFigures(IMAGES_QGROUP))?.exclusiveBytes ?? 0
    return { usedBytes, quotaBytes }
  }

  async sealStaging(stagingDir: string, target: string, tenantId?: string): Promise<void> {
    await this.ops.snapshot(stagingDir, target, true, await this.placement(tenantId, false))
    await this.deleteSubvolume(stagingDir)
  }

  /** New session workspace: a writable snapshot of the revision (O(1)), at generation 0. */
  async createWorkspace(sessionId: string, revisionId: string, tenantId?: string): Promise<string> {
    const target = this.newWorkspacePath(sessionId)
    await this.ops.snapshot(
      this.revisionPath(revisionId),
      target,
      false,
      await this.placement(tenantId, true),
    )
    // At a full quota even the marker (an xattr) is refused: no half-made workspace stays behind.
    await this.ops.setGeneration(target, 0).catch(async (error: unknown) => {
      // The refusal is what the caller hears (no session is made): a failed delete only leaves a
      // subvolume nothing points at.
      await this.deleteSubvolume(target).catch(() => undefined)
      throw error
    })
    return target
  }

  /** The generation recorded inside each workspace (`undefined`: no marker, or no workspace). */
  async readGenerations(sessionIds: string[]): Promise<(number | undefined)[]> {
    return this.ops.getGenerations(sessionIds.map((id) => this.workspacePath(id)))
  }

  /**
   * Bytes a subvolume uses: referenced (all its data) and exclusive (data no other subvolume
   * shares, i.e. what deleting it alone would free). With quota groups on, the subvolume's qgroup
   * answers at once (its figures include the subvolume's own metadata); otherwise a walk by file
   * descriptors sums the file extents (`extentUsage`: data only, O(files), no quota needed; not
   * `btrfs filesystem du`, whose walk by path names a swapped link could send elsewhere).
   */
  async usage(dir: string): Promise<TreeSizes> {
    // Simple quotas count what a tree wrote, not what it holds: sizes come from its extents.
    if (this.quotaMode === 'squota') return extentUsage(dir)
    if ((await stat(dir)).ino === SUBVOLUME_ROOT_INO && (await this.qgroupsEnabled(dir))) {
      const fromQgroup = await this.qgroupUsage(dir)
      if (fromQgroup) return fromQgroup
    }
    return extentUsage(dir)
  }

  /** Quota groups are on when this pool enables them, or when the operator did (asked once). */
  private async qgroupsEnabled(dir: string): Promise<boolean> {
    if (this.qgroups === undefined) {
      this.qgroups = await showQgroups(['--raw', '-f', dir])
        .then(() => true)
        .catch(() => false)
    }
    return this.qgroups
  }

  /**
   * The subvolume's level-0 qgroup, after a sync (qgroups are accounted at transaction commit, so
   * a write or delete just made would otherwise be missing). Undefined while the figures cannot be
   * trusted (a rescan running, data marked inconsistent): the caller walks the extents instead.
   */
  private async qgroupUsage(dir: string): Promise<TreeSizes | undefined> {
    let result: { stdout: string; stderr: string }
    try {
      result = await showQgroups(['--raw', '--sync', '-f', dir])
    } catch (error) {
      if (/not enabled/i.test(String((error as Error).message))) this.qgroups = false
      return undefined
    }
    if (/inconsistent|rescan/i.test(result.stderr)) return undefined
    for (const line of result.stdout.split('\n')) {
      const match = /^0\/\d+\s+(\d+)\s+(\d+)/.exec(line.trim())
      if (match?.[1] && match[2])
        return { referencedBytes: Number(match[1]), exclusiveBytes: Number(match[2]) }
    }
    return undefined
  }

  /**
   * Read-only snapshot of a session's workspace (the caller freezes the sandbox around it).
   * Resolves to the workspace's change mark right after the snapshot (see `workspaceMark`).
   */
  async snapshotWorkspace(
    sessionId: string,
    snapshotId: string,
    tenantId?: string,
  ): Promise<number | undefined> {
    return this.ops.snapshot(this.workspacePath(sessionId), this.snapshotPath(snapshotId), true, {
      mark: true,
      ...(await this.placement(tenantId, false)),
    })
  }

  /**
   * The workspace subvolume's ctransid: it moves whenever an inode in the workspace is updated
   * (files created, removed, renamed, truncated, chmod-ed, or written data flushed), but not on a
   * buffered write still in the page cache. Undefined when it cannot be read cheaply.
   */
  async workspaceMark(sessionId: string): Promise<number | undefined> {
    return this.ops.mark(this.workspacePath(sessionId))
  }

  /**
   * Replaces the workspace with a writable snapshot of `snapshotId`: an exact replica, nothing
   * left from after it, carrying `generation` as its marker.
   */
  async restoreWorkspace(
    sessionId: string,
    snapshotId: string,
    generation?: number,
    tenantId?: string,
  ): Promise<void> {
    const placement = await this.placement(tenantId, true)
    await this.swapWorkspace(
      sessionId,
      async (incoming) => {
        await this.ops.snapshot(this.snapshotPath(snapshotId), incoming, false, placement)
      },
      generation,
    )
  }

  /**
   * An empty writable subvolume, owned by the sandbox uid and under the workspace quota, to be
   * filled (an import) and then swapped in with `replaceWorkspace`, or discarded.
   */
  async createWorkspaceStaging(name: string, tenantId?: string): Promise<string> {
    const dir = path.join(this.areaDir('staging'), safeName(name))
    await this.deleteSubvolume(dir)
    await this.ops.create(dir, await this.placement(tenantId, true))
    try {
      await this.chownToSandbox(dir)
      await chmod(dir, 0o700)
    } catch (error) {
      // Refused (a full quota): the caller never learns the tree's name, so it goes here.
      await this.deleteSubvolume(dir)
      throw error
    }
    return dir
  }

  /** A new session's workspace as a writable snapshot of an existing snapshot (fork). */
  async forkWorkspace(sessionId: string, snapshotId: string, tenantId?: string): Promise<string> {
    const target = this.newWorkspacePath(sessionId)
    await this.ops.snapshot(
      this.snapshotPath(snapshotId),
      target,
      false,
      await this.placement(tenantId, true),
    )
    return target
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.deleteSubvolume(this.snapshotPath(snapshotId))
  }

  async deleteWorkspace(sessionId: string): Promise<void> {
    await this.deleteSubvolume(this.workspacePath(sessionId))
  }

  async deleteRevision(revisionId: string): Promise<void> {
    const dir = this.revisionPath(revisionId)
    if (!existsSync(dir)) return
    await execTool('btrfs', ['property', 'set', '-ts', dir, 'ro', 'false'], { code: 'storage_error' })
    await this.deleteSubvolume(dir)
  }

  protected async removeTree(dir: string): Promise<void> {
    await this.deleteSubvolume(dir)
  }

  protected async setGenerationMarker(dir: string, generation: number): Promise<void> {
    await this.ops.setGeneration(dir, generation)
  }

  private async deleteSubvolume(dir: string): Promise<void> {
    if (!existsSync(dir)) return
    const info = await stat(dir)
    // Only subvolume roots have that inode number; anything else is a plain directory.
    if (info.ino !== SUBVOLUME_ROOT_INO) {
      await removeTree(dir)
      return
    }
    try {
      await this.ops.delete(dir)
    } catch {
      // An agent may create subvolumes in its workspace (unprivileged users can); btrfs refuses
      // to delete a subvolume that holds others, so those go first, found and deleted by ID: a
      // walk by path names could be sent into another tenant's tree by a swapped link.
      await this.ops.deleteTree(dir)
    }
    // Under limits, the freed space counts again only after a commit: ask for one, not waiting.
    if (this.enforcing) this.commits.request()
  }
}
