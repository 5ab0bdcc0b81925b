import { CairnProblem } from '@cairn/protocol'

const CLAIM_KEPT_MS = 60_000

/**
 * Snapshots a restore or a fork is reading from. Retention runs beside them (after a turn's
 * automatic snapshot, and in the reaper) and skips pinned snapshots: it prunes them on its next
 * pass instead of pulling the source out from under a restore.
 */
export class SnapshotPins {
  private readonly pins = new Map<string, number>()
  /** Snapshots being deleted: a reader that picked one just before its row said so is refused. */
  private readonly deleting = new Set<string>()

  has(snapshotId: string): boolean {
    return this.pins.has(snapshotId)
  }

  /**
   * Claims the snapshot for deletion, unless a reader holds it (false). The check and the claim
   * are one step: a restore or fork that read the snapshot's row before the deletion recorded it
   * is refused when it comes to pin it.
   */
  claimForDeletion(snapshotId: string): boolean {
    if (this.pins.has(snapshotId)) return false
    this.deleting.add(snapshotId)
    // Once the row says deleted (well within this), no reader can pick the snapshot any more.
    setTimeout(() => this.deleting.delete(snapshotId), CLAIM_KEPT_MS).unref()
    return true
  }

  /**
   * Runs `fn` with the snapshot pinned. A snapshot being deleted is refused with `not_found`,
   * thrown at once (before `fn` starts).
   */
  hold<T>(snapshotId: string, fn: () => Promise<T>): Promise<T> {
    if (this.deleting.has(snapshotId)) throw new CairnProblem('not_found', `No snapshot ${snapshotId}`)
    this.pins.set(snapshotId, (this.pins.get(snapshotId) ?? 0) + 1)
    return (async () => {
      try {
        return await fn()
      } finally {
        const left = (this.pins.get(snapshotId) ?? 1) - 1
        if (left > 0) this.pins.set(snapshotId, left)
        else this.pins.delete(snapshotId)
      }
    })()
  }
}
