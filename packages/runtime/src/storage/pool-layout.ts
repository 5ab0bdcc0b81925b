import path from 'node:path'
import { execTool } from '../util/exec.js'
import { findMount } from '../util/mounts.js'
import { type PoolArea, safeName } from './pool.js'

/**
 * What every storage driver shares: where each kind of tree lives under the pool's mount point,
 * and letting go of that mount.
 */
export abstract class PoolLayout {
  /** Whether `open` made the mount (and `close` must undo it). */
  protected mountedHere = false

  protected constructor(private readonly mountPoint: string) {}

  get root(): string {
    return this.mountPoint
  }

  areaDir(area: PoolArea): string {
    return path.join(this.mountPoint, area)
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

  /** Unmounts what `open` mounted (a loop mount releases its loop device with it). */
  protected async unmount(): Promise<void> {
    if (!this.mountedHere && !findMount(this.mountPoint)) return
    await execTool('umount', [this.mountPoint], { code: 'storage_error' }).catch(async () => {
      // A sandbox that is still exiting may hold the mount for a moment; a lazy unmount
      // detaches it now and frees the loop device once the last user is gone.
      await execTool('umount', ['-l', this.mountPoint], { code: 'storage_error' })
    })
    this.mountedHere = false
  }
}
