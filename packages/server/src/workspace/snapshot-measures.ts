import { CairnProblem, type SnapshotInfo, type TreeSizes } from '@cairn/protocol'
import type { RuntimePort, TreeRef } from '@cairn/runtime/port'
import type { SnapshotStore } from '../snapshots/snapshot-store.js'
import type { HeavyReads } from './heavy-reads.js'

/** A digest being computed: its walk, and the requests waiting for it (it stops when all left). */
interface DigestWork {
  result: Promise<string>
  stop: AbortController
  waiting: number
}

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
  private readonly digests = new Map<string, DigestWork>()
  /** Size measurements in progress, by tree (its ID). */
  private readonly measuring = new Map<string, Promise<TreeSizes>>()

  constructor(
    private readonly runtime: RuntimePort,
    private readonly snapshots: SnapshotStore,
    private readonly heavyReads: HeavyReads,
  ) {}

  /** `signal`: the request went away (a digest no request waits for any more is stopped). */
  async withExtras(
    tenantId: string,
    snap: SnapshotInfo,
    want: SnapshotExtras,
    signal?: AbortSignal,
  ): Promise<SnapshotInfo> {
    const withDigest = want.digest ? await this.withDigest(tenantId, snap, signal) : snap
    return want.sizes ? { ...withDigest, sizes: await this.snapshotSizes(snap) } : withDigest
  }

  /** One measurement per tree at a time: concurrent requests for the same tree share it. */
  measure(tree: TreeRef): Promise<TreeSizes> {
    const key = Object.values(tree)[0] as string
    let work = this.measuring.get(key)
    if (!work) {
      work = this.runtime.treeSizes(tree)
      this.measuring.set(key, work)
      const forget = () => this.measuring.delete(key)
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
      return await this.measure({ snapshotId: snap.id })
    } catch (error) {
      if (!(await this.snapshots.get(snap.sessionId, snap.id)))
        throw new CairnProblem('not_found', `snapshot ${snap.id} was deleted while it was measured`)
      throw error
    }
  }

  /**
   * Fills in a snapshot's content digest, computing it once (lazily: it reads every file, in the
   * workspace reader's child process) and caching it in the database. Concurrent requests for the
   * same snapshot share one walk, which counts as one of the tenant's heavy reads and is killed
   * once no request waits for it any more.
   */
  private async withDigest(
    tenantId: string,
    snap: SnapshotInfo,
    signal?: AbortSignal,
  ): Promise<SnapshotInfo> {
    if (snap.digest) return snap
    let work = this.digests.get(snap.id)
    // One whose requests all left is being stopped: a new request starts afresh.
    if (!work || work.stop.signal.aborted) {
      const release = this.heavyReads.acquire(tenantId, 'a digest')
      const stop = new AbortController()
      const result = this.runtime.digest({ snapshotId: snap.id }, { background: true, signal: stop.signal })
      const started: DigestWork = { result, stop, waiting: 0 }
      work = started
      this.digests.set(snap.id, started)
      const forget = () => {
        release()
        if (this.digests.get(snap.id) === started) this.digests.delete(snap.id)
      }
      void result.then(forget, forget)
    }
    const shared = work
    shared.waiting++
    const leave = () => {
      shared.waiting--
      if (shared.waiting === 0) shared.stop.abort()
    }
    if (signal?.aborted) leave()
    else signal?.addEventListener('abort', leave, { once: true })
    let digest: string
    try {
      digest = await shared.result
    } catch (error) {
      // Retention may delete the snapshot while it is being read.
      if (!(await this.snapshots.get(snap.sessionId, snap.id)))
        throw new CairnProblem('not_found', `snapshot ${snap.id} was deleted while its digest was computed`)
      throw error
    } finally {
      signal?.removeEventListener('abort', leave)
    }
    await this.snapshots.setDigest(snap.id, digest)
    return { ...snap, digest }
  }
}
