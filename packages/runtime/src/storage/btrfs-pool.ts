import { existsSync } from 'node:fs'
import { chmod, chown, lstat, mkdir, readdir, rename, rm, stat, statfs } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { execTool } from '../util/exec.js'
import { findMount } from '../util/mounts.js'
import { BtrfsOps } from './btrfs-ops.js'

const BTRFS_MAGIC = 0x9123683e

export interface BtrfsPoolOptions {
  /** Where the pool is mounted (a directory the sandbox uid can traverse). */
  mountPoint: string
  /** Sparse image file to create and loop-mount when `existingPath` is not given. */
  imagePath: string
  imageSizeBytes: number
  /** Use this existing btrfs directory instead of an image (bind-mounted at `mountPoint`). */
  existingPath?: string | undefined
  /** Host uid/gid that owns session workspaces. */
  sandboxUid: number
  sandboxGid: number
  /** Size limit of every session workspace (btrfs qgroups); unset: no quota, qgroups stay off. */
  workspaceQuotaBytes?: number | undefined
}

const AREAS = ['revisions', 'sessions', 'snapshots', 'staging'] as const
type Area = (typeof AREAS)[number]

/**
 * The workspace store: one btrfs filesystem holding revisions (read-only subvolumes), session
 * workspaces (writable snapshots of a revision) and snapshots. Every operation is a subvolume
 * operation, so creating a session costs the same whatever the size of the project.
 */
export class BtrfsPool {
  private mountedHere = false
  readonly ops = new BtrfsOps()

  constructor(private readonly options: BtrfsPoolOptions) {}

  get root(): string {
    return this.options.mountPoint
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
      await execTool('mount', ['-o', 'loop,noatime,user_subvol_rm_allowed', imagePath, mountPoint], {
        code: 'storage_error',
      })
      this.mountedHere = true
    }
    await chmod(mountPoint, 0o711)
    if (this.options.workspaceQuotaBytes) {
      // Quota groups cost every snapshot a few milliseconds, so they are on only when asked for.
      await execTool('btrfs', ['quota', 'enable', mountPoint], { code: 'storage_error' })
    }
    for (const area of AREAS) {
      await mkdir(this.areaDir(area), { recursive: true })
      await chmod(this.areaDir(area), 0o711)
    }
  }

  /** Unmounts what `open` mounted (a loop mount releases its loop device with it). */
  async close(): Promise<void> {
    this.ops.close()
    if (!this.mountedHere && !findMount(this.options.mountPoint)) return
    await execTool('umount', [this.options.mountPoint], { code: 'storage_error' }).catch(async () => {
      // A sandbox that is still exiting may hold the mount for a moment; a lazy unmount
      // detaches it now and frees the loop device once the last user is gone.
      await execTool('umount', ['-l', this.options.mountPoint], { code: 'storage_error' })
    })
    this.mountedHere = false
  }

  areaDir(area: Area): string {
    return path.join(this.options.mountPoint, area)
  }

  revisionPath(revisionId: string): string {
    return path.join(this.areaDir('revisions'), safeName(revisionId))
  }

  workspacePath(sessionId: string): string {
    return path.join(this.areaDir('sessions'), safeName(sessionId))
  }

  snapshotPath(snapshotId: string): string {
    return path.join(this.areaDir('snapshots'), safeName(snapshotId))
  }

  /** A fresh writable subvolume in staging, to be filled and then sealed as a revision. */
  async createStaging(name: string): Promise<string> {
    const dir = path.join(this.areaDir('staging'), safeName(name))
    await this.deleteSubvolume(dir)
    await this.ops.create(dir)
    return dir
  }

  /**
   * Seals a filled staging subvolume as a read-only revision. Files are handed to the sandbox uid
   * once here, so every workspace snapshotted from the revision is already owned correctly.
   */
  async sealRevision(stagingDir: string, revisionId: string): Promise<string> {
    const target = this.revisionPath(revisionId)
    await execTool(
      'chown',
      ['-R', '--no-dereference', `${this.options.sandboxUid}:${this.options.sandboxGid}`, stagingDir],
      {
        code: 'storage_error',
      },
    )
    await chmod(stagingDir, 0o700)
    await this.ops.snapshot(stagingDir, target, true)
    await this.deleteSubvolume(stagingDir)
    return target
  }

  async discardStagingByName(name: string): Promise<void> {
    if (name.includes('/') || name.startsWith('.')) return
    await this.deleteSubvolume(path.join(this.areaDir('staging'), name))
  }

  async discardStaging(stagingDir: string): Promise<void> {
    await this.deleteSubvolume(stagingDir)
  }

  /** New session workspace: a writable snapshot of the revision (O(1)), at generation 0. */
  async createWorkspace(sessionId: string, revisionId: string): Promise<string> {
    const target = this.workspacePath(sessionId)
    if (existsSync(target)) throw new CairnProblem('storage_error', `workspace ${sessionId} already exists`)
    await this.ops.snapshot(this.revisionPath(revisionId), target, false)
    await this.ops.setGeneration(target, 0)
    await this.applyQuota(target)
    return target
  }

  /**
   * Records the workspace's generation inside its subvolume (a `trusted.` xattr on its root): it
   * travels with every snapshot of it, so a subvolume swapped for an older copy brings its older
   * number along, and a sandbox, having no CAP_SYS_ADMIN on the host, can neither read nor forge it.
   */
  async writeGeneration(sessionId: string, generation: number): Promise<void> {
    await this.ops.setGeneration(this.workspacePath(sessionId), generation)
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

  /** Bytes a subvolume uses: referenced (all its data) and exclusive (not shared with others). */
  async usage(dir: string): Promise<{ referencedBytes: number; exclusiveBytes: number }> {
    const { stdout } = await execTool('btrfs', ['filesystem', 'du', '-s', '--raw', dir], {
      code: 'storage_error',
    })
    const line = stdout.trim().split('\n').pop() ?? ''
    const [total, exclusive] = line.trim().split(/\s+/).map(Number)
    return { referencedBytes: total ?? 0, exclusiveBytes: exclusive ?? 0 }
  }

  async poolStats(): Promise<{ totalBytes: number; freeBytes: number }> {
    const fs = await statfs(this.options.mountPoint)
    return { totalBytes: fs.blocks * fs.bsize, freeBytes: fs.bavail * fs.bsize }
  }

  /** Read-only snapshot of a session's workspace (the caller freezes the sandbox around it). */
  async snapshotWorkspace(sessionId: string, snapshotId: string): Promise<string> {
    const target = this.snapshotPath(snapshotId)
    await this.ops.snapshot(this.workspacePath(sessionId), target, true)
    return target
  }

  async hasSnapshot(snapshotId: string): Promise<boolean> {
    return existsSync(this.snapshotPath(snapshotId))
  }

  /**
   * Replaces the workspace with a writable snapshot of `snapshotId`: an exact replica, nothing
   * left from after it, carrying `generation` as its marker. The new subvolume is made beside the old one and renamed into place, so a
   * crash leaves either the old workspace or the new one (`recoverWorkspace` finishes the swap).
   */
  async restoreWorkspace(sessionId: string, snapshotId: string, generation?: number): Promise<void> {
    const target = this.workspacePath(sessionId)
    const incoming = `${target}.restoring`
    const outgoing = `${target}.replaced`
    await this.deleteSubvolume(incoming)
    await this.deleteSubvolume(outgoing)
    await this.ops.snapshot(this.snapshotPath(snapshotId), incoming, false)
    // The new generation is written before the swap, so a crash at any point leaves a workspace
    // whose marker is never behind what the database recorded.
    if (generation !== undefined) await this.ops.setGeneration(incoming, generation)
    if (existsSync(target)) await rename(target, outgoing)
    await rename(incoming, target)
    await this.applyQuota(target)
    await this.deleteSubvolume(outgoing)
  }

  /** Finishes or rolls back a restore that a crash interrupted. */
  async recoverWorkspace(sessionId: string): Promise<void> {
    const target = this.workspacePath(sessionId)
    const incoming = `${target}.restoring`
    const outgoing = `${target}.replaced`
    if (!existsSync(target) && existsSync(incoming)) await rename(incoming, target)
    if (!existsSync(target) && existsSync(outgoing)) await rename(outgoing, target)
    await this.deleteSubvolume(incoming)
    await this.deleteSubvolume(outgoing)
  }

  /** A new session's workspace as a writable snapshot of an existing snapshot (fork). */
  async forkWorkspace(sessionId: string, snapshotId: string): Promise<string> {
    const target = this.workspacePath(sessionId)
    if (existsSync(target)) throw new CairnProblem('storage_error', `workspace ${sessionId} already exists`)
    await this.ops.snapshot(this.snapshotPath(snapshotId), target, false)
    await this.applyQuota(target)
    return target
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.deleteSubvolume(this.snapshotPath(snapshotId))
  }

  /** Names of the subvolumes in one area (for consistency checks against the database). */
  async listArea(area: Area): Promise<string[]> {
    return (await readdir(this.areaDir(area))).filter((name) => !name.startsWith('.'))
  }

  async hasWorkspace(sessionId: string): Promise<boolean> {
    return existsSync(this.workspacePath(sessionId))
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

  async hasRevision(revisionId: string): Promise<boolean> {
    return existsSync(this.revisionPath(revisionId))
  }

  private async deleteSubvolume(dir: string): Promise<void> {
    if (!existsSync(dir)) return
    const info = await stat(dir)
    // Subvolume roots have inode 256 on btrfs; anything else is a plain directory.
    if (info.ino !== 256) {
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

  /** Hands a directory to the sandbox uid (used for workspaces created outside a revision). */
  async chownToSandbox(dir: string): Promise<void> {
    await chown(dir, this.options.sandboxUid, this.options.sandboxGid)
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
      if (info.dev !== dev && info.ino === 256) found.push(child)
      else if (info.dev === dev) await walk(child)
    }
  }
  await walk(dir)
  return found
}

function safeName(id: string): string {
  if (!/^[a-z]+_[0-9a-z]+$/.test(id)) throw new CairnProblem('bad_request', `invalid identifier '${id}'`)
  return id
}
