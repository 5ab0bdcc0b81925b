import { execTool } from '../util/exec.js'

/**
 * Asks btrfs for a transaction commit after subvolumes are deleted, off the caller's path. A
 * deleted subvolume's extents are dropped by the cleaner only after the next commit (every 30 s
 * unless one is asked for), so without it a tenant at its quota that deletes snapshots to make room
 * is still refused `quota_exceeded` for up to 30 s. `btrfs filesystem sync` commits and wakes the
 * cleaner. At most one runs at a time; requests made while one runs are coalesced into one more
 * after it (a commit already under way may have started before their deletion).
 */
export class CommitRequester {
  private running: Promise<void> | undefined
  private again = false

  constructor(private readonly mountPoint: string) {}

  /** Starts a commit (or marks one to follow the running one); never waits, never throws. */
  request(): void {
    if (this.running) {
      this.again = true
      return
    }
    this.running = this.loop()
  }

  /** Resolves once no commit runs (before the pool is unmounted). */
  async settled(): Promise<void> {
    await this.running
  }

  private async loop(): Promise<void> {
    do {
      this.again = false
      // A failed commit only leaves the space to the kernel's own interval: nothing to report.
      await execTool('btrfs', ['filesystem', 'sync', this.mountPoint], { code: 'storage_error' }).catch(
        () => undefined,
      )
    } while (this.again)
    this.running = undefined
  }
}
