/**
 * Snapshots a restore or a fork is reading from. Retention runs beside them (after a turn's
 * automatic snapshot, and in the reaper) and skips pinned snapshots: it prunes them on its next
 * pass instead of pulling the source out from under a restore.
 */
export class SnapshotPins {
  private readonly pins = new Map<string, number>()

  has(snapshotId: string): boolean {
    return this.pins.has(snapshotId)
  }

  /** Runs `fn` with the snapshot pinned. */
  async hold<T>(snapshotId: string, fn: () => Promise<T>): Promise<T> {
    this.pins.set(snapshotId, (this.pins.get(snapshotId) ?? 0) + 1)
    try {
      return await fn()
    } finally {
      const left = (this.pins.get(snapshotId) ?? 1) - 1
      if (left > 0) this.pins.set(snapshotId, left)
      else this.pins.delete(snapshotId)
    }
  }
}
