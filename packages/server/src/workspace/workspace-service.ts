import type { InterruptedTurn, SessionRow } from '../sessions/session-store.js'
import { SnapshotPins } from '../snapshots/snapshot-pins.js'
import { SnapshotStore } from '../snapshots/snapshot-store.js'
import { HeavyReads } from './heavy-reads.js'
import { completeInterruptedTurns } from './interrupted-turns.js'
import { WorkspaceMerge } from './merge/workspace-merge.js'
import { SnapshotMeasures } from './snapshot-measures.js'
import { SnapshotPolicy } from './snapshot-policy.js'
import { WorkspaceArchive } from './workspace-archive.js'
import type { WorkspaceServiceDeps } from './workspace-deps.js'
import { WorkspaceFiles } from './workspace-files.js'
import { WorkspaceHistory } from './workspace-history.js'
import { WorkspaceManifest } from './workspace-manifest.js'

export type { WorkspaceServiceDeps } from './workspace-deps.js'

/**
 * The session workspace as a versioned object: snapshots (frozen, O(1)), exact restore, fork,
 * files, diff and export. Every mutation holds the session's turn lock. Each concern lives in its
 * own part; this puts them together over one snapshot store, one set of pins and one policy.
 */
export class WorkspaceService {
  readonly snapshots: SnapshotStore
  /** Snapshots a restore or a fork is copying from: retention leaves them for its next pass. */
  readonly pins = new SnapshotPins()
  /** When snapshots are taken and kept. */
  readonly policy: SnapshotPolicy
  /** Manual snapshots, restore, undo and fork. */
  readonly history: WorkspaceHistory
  /** Files of the workspace and its snapshots, and diffs. */
  readonly files: WorkspaceFiles
  /** Export and import as tar.gz. */
  readonly archive: WorkspaceArchive
  readonly manifest: WorkspaceManifest
  /** Merging a fork's changes back into its parent (or another session of its agent). */
  readonly merges: WorkspaceMerge

  constructor(private readonly deps: WorkspaceServiceDeps) {
    this.snapshots = new SnapshotStore(deps.db)
    /** Digests and exports running per tenant. */
    const heavyReads = new HeavyReads()
    const measures = new SnapshotMeasures(deps.runtime, this.snapshots, heavyReads)
    this.policy = new SnapshotPolicy(deps, this.snapshots, this.pins)
    this.history = new WorkspaceHistory(deps, this.snapshots, this.pins, this.policy, measures)
    this.files = new WorkspaceFiles(deps, this.snapshots, this.policy, heavyReads)
    this.archive = new WorkspaceArchive(deps, this.pins, this.policy, this.files, heavyReads)
    this.manifest = new WorkspaceManifest(deps, this.snapshots, this.policy, this.files, measures)
    this.merges = new WorkspaceMerge(deps, this.snapshots, this.pins, this.policy, heavyReads)
  }

  /** The automatic snapshot after a successful setup phase (see `SnapshotPolicy`). */
  snapshotAfterSetup(row: SessionRow) {
    return this.policy.snapshotAfterSetup(row)
  }

  /** After a crash, gives every interrupted turn its pre-turn snapshot. */
  completeInterruptedTurns(turns: InterruptedTurn[]): Promise<number> {
    return completeInterruptedTurns(this.deps, this.snapshots, this.policy, turns)
  }

  /** Waits for background snapshot and retention work (used on shutdown and by tests). */
  settle(): Promise<void> {
    return this.policy.settle()
  }
}
