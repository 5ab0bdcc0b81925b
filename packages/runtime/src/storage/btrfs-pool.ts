import { existsSync } from 'node:fs'
import { chmod, lstat, mkdir, readdir, rm, stat, statfs } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { execTool } from '../util/exec.js'
import { findMount } from '../util/mounts.js'
import { BtrfsOps } from './btrfs-ops.js'
import { POOL_AREAS, type StoragePool, type StoragePoolOptions, safeName, type TreeSizes } from './pool.js'
import { PoolLayout } from './pool-layout.js'

const BTRFS_MAGIC = 0x9123683e
/** Every subvolume's root directory has this inode number. */
const SUBVOLUME_ROOT_INO = 256

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
  readonly ops = new BtrfsOps()

  constructor(private readonly options: BtrfsPoolOptions) {
    super(options)
  }

  describe(): string {
    return `btrfs pool at ${this.options.mountPoint}${this.options.workspaceQuotaBytes ? ' (qgroup quotas)' : ''}`
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
    if (this.options.workspaceQuotaBytes) {
      // Quota groups cost every snapshot a few milliseconds, so they are on only when asked for.
      await execTool('btrfs', ['quota', 'enable', mountPoint], { code: 'storage_error' })
      this.qgroups = true
    }
    for (const area of POOL_AREAS) {
      await mkdir(this.areaDir(area), { recursive: true })
      await chmod(this.areaDir(area), 0o711)
    }
  }

  async close(): Promise<void> {
    this.ops.close()
    await this.unmount()
  }

  /** A fresh writable subvolume in staging, to be filled and then sealed as a revision. */
  async createStaging(name: string): Promise<string> {
    const dir = path.join(this.areaDir('staging'), safeName(name))
    await this.deleteSubvolume(dir)
    await this.ops.create(dir)
    return dir
  }

  /** Seals a filled staging subvolume as a read-only revision owned by the sandbox uid. */
  async sealRevision(stagingDir: string, revisionId: string): Promise<string> {
    const target = this.revisionPath(revisionId)
    await this.handToSandbox(stagingDir)
    await this.ops.snapshot(stagingDir, target, true)
    await this.deleteSubvolume(stagingDir)
    return target
  }

  async discardStaging(stagingDir: string): Promise<void> {
    await this.deleteSubvolume(stagingDir)
  }

  async sealStaging(stagingDir: string, target: string): Promise<void> {
    await this.ops.snapshot(stagingDir, target, true)
    await this.deleteSubvolume(stagingDir)
  }

  /** New session workspace: a writable snapshot of the revision (O(1)), at generation 0. */
  async createWorkspace(sessionId: string, revisionId: string): Promise<string> {
    const target = this.newWorkspacePath(sessionId)
    await this.ops.snapshot(this.revisionPath(revisionId), target, false)
    await this.ops.setGeneration(target, 0)
    await this.applyQuota(target)
    return target
  }

  /** The generation recorded inside each workspace (`undefined`: no marker, or no workspace). */
  async readGenerations(sessionIds: string[]): Promise<(number | undefined)[]> {
    return this.ops.getGenerations(sessionIds.map((id) => this.workspacePath(id)))
  }

  /** Limits a workspace's size: writes past it fail inside the sandbox (EDQUOT), not on the host. */
  private async applyQuota(dir: string): Promise<void> {
    const bytes = this.options.workspaceQuotaBytes
    if (!bytes) return
    await execTool('btrfs', ['qgroup', 'limit', String(bytes), dir], { code: 'storage_error' })
  }

  /**
   * Bytes a subvolume uses: referenced (all its data) and exclusive (data no other subvolume
   * shares, i.e. what deleting it alone would free). With quota groups on, the subvolume's qgroup
   * answers at once (its figures include the subvolume's own metadata); otherwise
   * `btrfs filesystem du` walks the file extents (data only, O(files), no quota needed).
   */
  async usage(dir: string): Promise<TreeSizes> {
    if ((await stat(dir)).ino === SUBVOLUME_ROOT_INO && (await this.qgroupsEnabled(dir))) {
      const fromQgroup = await this.qgroupUsage(dir)
      if (fromQgroup) return fromQgroup
    }
    const { stdout } = await execTool('btrfs', ['filesystem', 'du', '-s', '--raw', dir], {
      code: 'storage_error',
    })
    const line = stdout.trim().split('\n').pop() ?? ''
    const [total, exclusive] = line.trim().split(/\s+/).map(Number)
    return { referencedBytes: total ?? 0, exclusiveBytes: exclusive ?? 0 }
  }

  /** Quota groups are on when this pool enables them, or when the operator did (asked once). */
  private async qgroupsEnabled(dir: string): Promise<boolean> {
    if (this.qgroups === undefined) {
      this.qgroups = await execTool('btrfs', ['qgroup', 'show', '--raw', '-f', dir], {
        code: 'storage_error',
      })
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
      result = await execTool('btrfs', ['qgroup', 'show', '--raw', '--sync', '-f', dir], {
        code: 'storage_error',
      })
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
  async snapshotWorkspace(sessionId: string, snapshotId: string): Promise<number | undefined> {
    return this.ops.snapshot(this.workspacePath(sessionId), this.snapshotPath(snapshotId), true, {
      mark: true,
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
  async restoreWorkspace(sessionId: string, snapshotId: string, generation?: number): Promise<void> {
    await this.swapWorkspace(
      sessionId,
      async (incoming) => {
        await this.ops.snapshot(this.snapshotPath(snapshotId), incoming, false)
      },
      generation,
    )
  }

  /**
   * An empty writable subvolume, owned by the sandbox uid and under the workspace quota, to be
   * filled (an import) and then swapped in with `replaceWorkspace`, or discarded.
   */
  async createWorkspaceStaging(name: string): Promise<string> {
    const dir = await this.createStaging(name)
    await this.chownToSandbox(dir)
    await chmod(dir, 0o700)
    await this.applyQuota(dir)
    return dir
  }

  /** A new session's workspace as a writable snapshot of an existing snapshot (fork). */
  async forkWorkspace(sessionId: string, snapshotId: string): Promise<string> {
    const target = this.newWorkspacePath(sessionId)
    await this.ops.snapshot(this.snapshotPath(snapshotId), target, false)
    await this.applyQuota(target)
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

  protected override async afterSwap(target: string): Promise<void> {
    await this.applyQuota(target)
  }

  private async deleteSubvolume(dir: string): Promise<void> {
    if (!existsSync(dir)) return
    const info = await stat(dir)
    // Only subvolume roots have that inode number; anything else is a plain directory.
    if (info.ino !== SUBVOLUME_ROOT_INO) {
      await rm(dir, { recursive: true, force: true })
      return
    }
    try {
      await this.ops.delete(dir)
    } catch (error) {
      // An agent may create subvolumes in its workspace (unprivileged users can); btrfs refuses
      // to delete a subvolume that holds others, so those go first. Only this slow path walks.
      const nested = await nestedSubvolumes(dir, info.dev)
      if (nested.length === 0) throw error
      for (const inner of nested) await this.deleteSubvolume(inner)
      await this.ops.delete(dir)
    }
  }
}

/** Subvolumes directly inside `dir` (their roots sit on another st_dev than the parent's files). */
async function nestedSubvolumes(dir: string, dev: number): Promise<string[]> {
  const found: string[] = []
  const walk = async (current: string): Promise<void> => {
    const entries = await readdir(current, { withFileTypes: true })
    for (const entry of entries) {
      if (!entry.isDirectory()) continue
      const child = path.join(current, entry.name)
      const info = await lstat(child)
      if (info.dev !== dev && info.ino === SUBVOLUME_ROOT_INO) found.push(child)
      else if (info.dev === dev) await walk(child)
    }
  }
  await walk(dir)
  return found
}
