import { existsSync } from 'node:fs'
import { chmod, chown, readdir, rename, statfs } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { execTool } from '../util/exec.js'
import { findMount } from '../util/mounts.js'
import { OneAtATime } from '../util/one-at-a-time.js'
import { type PoolArea, type PoolStats, type StoragePoolOptions, safeName } from './pool.js'
import { asSpaceProblem } from './space-problem.js'

/**
 * What every storage driver shares: where each kind of tree lives under the pool's mount point,
 * the lookups and the crash recovery that only rename or test paths, and letting go of that mount.
 * How a tree is copied or removed is the driver's (`removeTree`).
 */
export abstract class PoolLayout {
  /** Whether `open` made the mount (and `close` must undo it). */
  protected mountedHere = false

  protected constructor(private readonly layout: StoragePoolOptions) {}

  get root(): string {
    return this.layout.mountPoint
  }

  areaDir(area: PoolArea): string {
    return path.join(this.layout.mountPoint, area)
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

  /** Names of the trees in one area (for consistency checks against the database). */
  async listArea(area: PoolArea): Promise<string[]> {
    return (await readdir(this.areaDir(area))).filter((name) => !name.startsWith('.'))
  }

  async hasRevision(revisionId: string): Promise<boolean> {
    return existsSync(this.revisionPath(revisionId))
  }

  async hasWorkspace(sessionId: string): Promise<boolean> {
    return existsSync(this.workspacePath(sessionId))
  }

  async hasSnapshot(snapshotId: string): Promise<boolean> {
    return existsSync(this.snapshotPath(snapshotId))
  }

  async poolStats(): Promise<PoolStats> {
    const fs = await statfs(this.layout.mountPoint)
    return {
      totalBytes: fs.blocks * fs.bsize,
      usedBytes: (fs.blocks - fs.bfree) * fs.bsize,
      freeBytes: fs.bavail * fs.bsize,
    }
  }

  async discardStagingByName(name: string): Promise<void> {
    if (name.includes('/') || name.startsWith('.')) return
    await this.removeTree(path.join(this.areaDir('staging'), name))
  }

  /**
   * Hands a directory to the sandbox uid (used for workspaces created outside a revision). At a
   * full quota the kernel refuses even this (EDQUOT): `quota_exceeded`, not an untyped error.
   */
  async chownToSandbox(dir: string): Promise<void> {
    await chown(dir, this.layout.sandboxUid, this.layout.sandboxGid).catch((error: unknown) => {
      throw asSpaceProblem(error, `handing ${path.basename(dir)} to the sandbox user`)
    })
  }

  /** Finishes or rolls back a restore or import that a crash interrupted (see `swapPaths`). */
  async recoverWorkspace(sessionId: string): Promise<void> {
    const { target, incoming, outgoing } = this.swapPaths(sessionId)
    if (!existsSync(target) && existsSync(incoming)) await rename(incoming, target)
    if (!existsSync(target) && existsSync(outgoing)) await rename(outgoing, target)
    await this.removeTree(incoming)
    await this.removeTree(outgoing)
  }

  /**
   * Records the workspace's generation inside its tree (a `trusted.` xattr on its root): it
   * travels with every snapshot of it, so a tree swapped for an older copy brings its older number
   * along, and a sandbox, having no CAP_SYS_ADMIN on the host, can neither read nor forge it.
   */
  async writeGeneration(sessionId: string, generation: number): Promise<void> {
    await this.setGenerationMarker(this.workspacePath(sessionId), generation)
  }

  /** Replaces the workspace with a filled staging tree (see `createWorkspaceStaging`), by the same swap as a restore. */
  async replaceWorkspace(sessionId: string, stagingDir: string, generation?: number): Promise<void> {
    await this.swapWorkspace(sessionId, (incoming) => rename(stagingDir, incoming), generation)
  }

  /** Removes a tree of the pool, if it is there. */
  protected abstract removeTree(dir: string): Promise<void>

  /** Writes the generation marker on the root of a workspace tree. */
  protected abstract setGenerationMarker(dir: string, generation: number): Promise<void>

  /** Called with a workspace just swapped into place (the btrfs pool sets its quota). */
  protected async afterSwap(_target: string): Promise<void> {}

  /** Each session's swaps, one after another. */
  private readonly swaps = new OneAtATime()

  /**
   * The new workspace is made beside the old one and renamed into place (see `swapPaths`), one
   * swap of a session at a time: a restore and a recovery from the bucket reaching a node at once
   * (or two replicas' recoveries) each removed what stood beside the workspace first, the other's
   * half-made tree included, and a rename then found nothing: the workspace was left missing.
   */
  protected swapWorkspace(
    sessionId: string,
    make: (incoming: string) => Promise<void>,
    generation: number | undefined,
  ): Promise<void> {
    return this.swaps.run(sessionId, () => this.swapNow(sessionId, make, generation))
  }

  private async swapNow(
    sessionId: string,
    make: (incoming: string) => Promise<void>,
    generation: number | undefined,
  ): Promise<void> {
    const { target, incoming, outgoing } = this.swapPaths(sessionId)
    await this.removeTree(incoming)
    await this.removeTree(outgoing)
    try {
      await make(incoming)
      // The new generation is written before the swap, so a crash at any point leaves a workspace
      // whose marker is never behind what the database recorded.
      if (generation !== undefined) await this.setGenerationMarker(incoming, generation)
    } catch (error) {
      // Refused (a full quota, say) before anything was swapped: nothing half-made stays behind.
      await this.removeTree(incoming).catch(() => undefined)
      throw error
    }
    if (existsSync(target)) await rename(target, outgoing)
    await rename(incoming, target)
    await this.afterSwap(target)
    await this.removeTree(outgoing)
  }

  /**
   * A workspace is replaced by making the new tree at `incoming` beside it, moving the old one to
   * `outgoing`, and renaming: a crash leaves either tree, and `recoverWorkspace` finishes the swap.
   */
  protected swapPaths(sessionId: string): { target: string; incoming: string; outgoing: string } {
    const target = this.workspacePath(sessionId)
    return { target, incoming: `${target}.restoring`, outgoing: `${target}.replaced` }
  }

  /** Where a new session's workspace goes; refused if one is already there. */
  protected newWorkspacePath(sessionId: string): string {
    const target = this.workspacePath(sessionId)
    if (existsSync(target)) throw new CairnProblem('storage_error', `workspace ${sessionId} already exists`)
    return target
  }

  /**
   * Hands a filled staging tree to the sandbox uid before it is sealed as a revision: done once
   * here, every workspace copied from the revision is already owned correctly.
   */
  protected async handToSandbox(stagingDir: string): Promise<void> {
    const { sandboxUid, sandboxGid } = this.layout
    await execTool('chown', ['-R', '--no-dereference', `${sandboxUid}:${sandboxGid}`, stagingDir], {
      code: 'storage_error',
    })
    await chmod(stagingDir, 0o700)
  }

  /** Unmounts what `open` mounted (a loop mount releases its loop device with it). */
  protected async unmount(): Promise<void> {
    const { mountPoint } = this.layout
    if (!this.mountedHere && !findMount(mountPoint)) return
    await execTool('umount', [mountPoint], { code: 'storage_error' }).catch(async () => {
      // A sandbox that is still exiting may hold the mount for a moment; a lazy unmount
      // detaches it now and frees the loop device once the last user is gone.
      await execTool('umount', ['-l', mountPoint], { code: 'storage_error' })
    })
    this.mountedHere = false
  }
}
