import { CairnProblem, type SnapshotInfo, type TreeSizes } from '@cairn/protocol'
import type { StoragePool } from '@cairn/runtime'
import { treeDigest } from '../files/digest.js'
import type { SnapshotStore } from '../snapshots/snapshot-store.js'

/** What to add to a snapshot's record, on request: both read the tree. */
export interface SnapshotExtras {
  digest?: boolean | undefined
  sizes?: boolean | undefined
}

/**
 * The figures that read a whole tree: a snapshot's content digest and the bytes a tree uses.
 * Concurrent requests for the same tree share one walk.
 */
export class SnapshotMeasures {
  /** Digests being computed, by snapshot ID. */
  private readonly digests = new Map<string, Promise<string>>()
  /** Size measurements in progress, by tree path. */
  private readonly measuring = new Map<string, Promise<TreeSizes>>()

  constructor(
    private readonly pool: StoragePool,
    private readonly snapshots: SnapshotStore,
  ) {}

  async withExtras(snap: SnapshotInfo, want: SnapshotExtras): Promise<SnapshotInfo> {
    const withDigest = want.digest ? await this.withDigest(snap) : snap
    return want.sizes ? { ...withDigest, sizes: await this.snapshotSizes(snap) } : withDigest
  }

  /** One measurement per tree at a time: concurrent requests for the same tree share it. */
  measure(dir: string): Promise<TreeSizes> {
    let work = this.measuring.get(dir)
    if (!work) {
      work = this.pool.usage(dir)
      this.measuring.set(dir, work)
      const forget = () => this.measuring.delete(dir)
      void work.then(forget, forget)
    }
    return work
  }

  /**
   * Measures a snapshot now. Nothing is stored: referenced bytes never change for a read-only
   * snapshot, but they come from the same measurement as exclusive bytes, which grow when the
   * workspace or a sibling snapshot stops sharing data (a file deleted, a snapshot removed), so
   * storing one would save nothing and storing the other would go stale.
   */
  private async snapshotSizes(snap: SnapshotInfo): Promise<TreeSizes> {
    try {
      return await this.measure(this.pool.snapshotPath(snap.id))
    } catch (error) {
      if (!this.snapshots.get(snap.sessionId, snap.id))
        throw new CairnProblem('not_found', `snapshot ${snap.id} was deleted while it was measured`)
      throw error
    }
  }

  /**
   * Fills in a snapshot's content digest, computing it once (lazily: it reads every file) and
   * caching it in the database; concurrent requests for the same snapshot share one walk.
   */
  private async withDigest(snap: SnapshotInfo): Promise<SnapshotInfo> {
    if (snap.digest) return snap
    let work = this.digests.get(snap.id)
    if (!work) {
      work = treeDigest(this.pool.snapshotPath(snap.id))
      this.digests.set(snap.id, work)
      void work.then(
        () => this.digests.delete(snap.id),
        () => this.digests.delete(snap.id),
      )
    }
    let digest: string
    try {
      digest = await work
    } catch (error) {
      // Retention may delete the snapshot while it is being read.
      if (!this.snapshots.get(snap.sessionId, snap.id))
        throw new CairnProblem('not_found', `snapshot ${snap.id} was deleted while its digest was computed`)
      throw error
    }
    this.snapshots.setDigest(snap.id, digest)
    return { ...snap, digest }
  }
}
