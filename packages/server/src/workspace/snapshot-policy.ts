import { newId, type SnapshotInfo, type SnapshotReason } from '@cairn/protocol'
import type { AgentInfo, SnapshotOptions, WorkspaceMark } from '@cairn/runtime/port'
import { iso } from '../clock.js'
import type { MarkAnswer, SessionObserver } from '../sessions/session-observer.js'
import type { SessionRow } from '../sessions/session-store.js'
import type { SnapshotPins } from '../snapshots/snapshot-pins.js'
import type { SnapshotStore } from '../snapshots/snapshot-store.js'
import type { WorkspaceServiceDeps } from './workspace-deps.js'

/** The workspace as of an automatic snapshot, to tell whether a later turn changed it. */
interface SnapshotMark extends WorkspaceMark {
  snapshotId: string
}

/**
 * When snapshots are taken and how long automatic ones are kept: the snapshot before each turn
 * (taken after the previous one, off the reply's critical path), the one at creation and after
 * setup, keep-last-N, and whether a turn changed the workspace at all.
 */
export class SnapshotPolicy implements SessionObserver {
  private retention: Promise<void> = Promise.resolve()
  private readonly pending = new Map<string, Promise<void>>()
  /** Sessions whose workspace changed outside a turn since their last snapshot. */
  private readonly dirty = new Set<string>()
  /** Per session, what its workspace looked like when its newest automatic snapshot was taken. */
  private readonly marks = new Map<string, SnapshotMark>()
  /** The mark each session's turn was sent with (`turnMark`), and the snapshot mark it stands for. */
  private readonly sent = new Map<string, { mark: WorkspaceMark; of: SnapshotMark }>()

  constructor(
    private readonly deps: WorkspaceServiceDeps,
    private readonly snapshots: SnapshotStore,
    private readonly pins: SnapshotPins,
  ) {}

  // The snapshot that lets turn N be undone is the state after turn N-1. It is taken as soon as
  // turn N-1 ends (the agent is waiting for input), off the critical path of the reply; turn N
  // waits for it, and takes one itself when something changed the workspace in between.

  afterTurn(row: SessionRow, seq: number, agent: AgentInfo | undefined, unchanged: boolean): void {
    if (!row.auto_snapshots) return
    this.track(row.id, this.snapshotAfterTurn(row, seq, agent?.alive === true, unchanged))
  }

  async unchanged(sessionId: string, answered?: MarkAnswer): Promise<boolean> {
    const mark = this.marks.get(sessionId)
    if (!mark) return false
    // The runtime compared this very mark after the turn (see `turnMark`): its answer stands.
    const sent = this.sent.get(sessionId)
    if (answered && sent && answered.mark === sent.mark && sent.of === mark)
      return answered.unchanged && !this.dirty.has(sessionId)
    return this.unchangedSince(sessionId, mark)
  }

  turnMark(sessionId: string): WorkspaceMark | undefined {
    const of = this.marks.get(sessionId)
    if (!of || this.dirty.has(sessionId)) return undefined
    // Plain data for the port (the snapshot's ID is the server's).
    const mark = { sandboxId: of.sandboxId, ctransid: of.ctransid, writtenBytes: of.writtenBytes }
    this.sent.set(sessionId, { mark, of })
    return mark
  }

  /**
   * The state before turn 1 is the revision: snapshot it at creation, before any sandbox exists,
   * so the first turn neither waits for it nor freezes a sandbox that is still starting.
   */
  created(row: SessionRow): void {
    if (!row.auto_snapshots) return
    this.track(row.id, this.take(row, 'auto', 'before_turn', 0))
  }

  async beforeTurn(row: SessionRow, seq: number): Promise<void> {
    if (!row.auto_snapshots) return
    await this.pending.get(row.id)
    // The turn's own read of its session said whether one stood; one that did not may have been
    // recorded since (the last turn's, in the background): only then is it looked for.
    const stands = async () =>
      (Boolean(row.snapshot_stands) && row.turn_count === seq - 1) ||
      (await this.snapshots.atTurn(row.id, seq - 1)) !== undefined
    if (this.dirty.has(row.id) || !(await stands())) {
      this.dirty.delete(row.id)
      await this.take(row, 'auto', 'before_turn', seq - 1)
    }
  }

  deleted(sessionId: string): Promise<void> {
    this.marks.delete(sessionId)
    this.sent.delete(sessionId)
    return this.deleteAll(sessionId)
  }

  /** Waits for the session's background snapshot, if one is being taken. */
  async settled(sessionId: string): Promise<void> {
    await this.pending.get(sessionId)
  }

  /** The workspace changed outside a turn: the next turn takes its own pre-turn snapshot. */
  changed(sessionId: string): void {
    this.dirty.add(sessionId)
  }

  /** The workspace was replaced: no later turn can stand on the last automatic snapshot. */
  replaced(sessionId: string): void {
    this.dirty.add(sessionId)
    this.marks.delete(sessionId)
  }

  /** The snapshot is gone: the next turn that changed nothing can no longer stand on it. */
  snapshotDeleted(sessionId: string, snapshotId: string): void {
    if (this.marks.get(sessionId)?.snapshotId === snapshotId) this.marks.delete(sessionId)
  }

  /**
   * The snapshot that makes turn `seq + 1` undoable. When the turn changed nothing in the
   * workspace, the previous automatic snapshot already is that state: it is recorded as standing
   * for this turn too, and no snapshot (a btrfs transaction commit) is taken. `unchanged` is the
   * turn runner's answer from `unchangedSince` (the one that kept the generation), not asked again.
   */
  private async snapshotAfterTurn(
    row: SessionRow,
    seq: number,
    warm: boolean,
    unchanged: boolean,
  ): Promise<void> {
    // After the reply's stream is ended (the hook runs just after run.completed is written).
    await new Promise((resolve) => setImmediate(resolve))
    const mark = this.marks.get(row.id)
    if (mark && warm && unchanged && (await this.snapshots.extendThrough(mark.snapshotId, seq))) return
    await this.take(row, 'auto', 'before_turn', seq)
  }

  /**
   * Whether the workspace is exactly as it was when `mark` was taken: nothing written through the
   * API, the same sandbox still running (a sandbox that stopped in between could have written and
   * gone), no page of file data dirtied by its processes (buffered writes reach btrfs's trees only
   * when flushed), and no inode of the workspace updated (the subvolume's ctransid). Any doubt
   * answers no.
   */
  private async unchangedSince(sessionId: string, mark: SnapshotMark): Promise<boolean> {
    if (this.dirty.has(sessionId)) return false
    const { sandboxId, ctransid, writtenBytes } = mark
    const same = await this.deps.runtime.unchangedSince(sessionId, { sandboxId, ctransid, writtenBytes })
    return same && !this.dirty.has(sessionId)
  }

  /**
   * The automatic snapshot after a successful setup phase. The workspace counts as changed, so the
   * first turn's pre-turn snapshot is the set-up workspace and undoing turn 1 keeps the setup.
   */
  async snapshotAfterSetup(row: SessionRow): Promise<SnapshotInfo> {
    await this.pending.get(row.id)
    const info = await this.take(row, 'auto', 'after_setup', 0)
    if (row.auto_snapshots) this.dirty.add(row.id)
    return info
  }

  /** Remembers a background snapshot so the next operation on the session waits for it. */
  private track(sessionId: string, work: Promise<unknown>): void {
    const pending = work
      .then(() => undefined)
      .catch((error) =>
        this.deps.logger.warn({ err: error, session: sessionId }, 'background snapshot failed'),
      )
    this.pending.set(sessionId, pending)
    void pending.finally(() => {
      if (this.pending.get(sessionId) === pending) this.pending.delete(sessionId)
    })
  }

  private now(): string {
    return iso(this.deps.clock.now())
  }

  /** Takes a snapshot with the sandbox (if warm) frozen, then applies keep-last-N to automatic ones. */
  async take(
    row: SessionRow,
    kind: 'auto' | 'manual',
    reason: SnapshotReason,
    turnSeq: number,
    label?: string,
    snapshotId = newId('snapshot'),
  ): Promise<SnapshotInfo> {
    // Every kept snapshot is shipped by a node that has a bucket (docs/shipping.md).
    const seen = await this.frozenSnapshot(row, snapshotId, { ship: true })
    const current = await this.deps.sessions.store.get(row.tenant_id, row.id)
    const info = await this.snapshots.insertWithId(snapshotId, {
      session_id: row.id,
      tenant_id: row.tenant_id,
      kind,
      reason,
      label: label ?? null,
      turn_seq: turnSeq,
      generation: current?.generation ?? row.generation,
      created_at: this.now(),
    })
    if (kind === 'auto') {
      if (seen) this.marks.set(row.id, { snapshotId, ...seen })
      else this.marks.delete(row.id)
    }
    // Pruning old automatic snapshots is off the turn's critical path, serialised per service.
    if (kind === 'auto')
      this.retention = this.retention
        .then(async () => {
          await this.applyRetention(row.id, row.tenant_id)
        })
        // Pruning is retried after the next auto snapshot; a failure only keeps snapshots longer.
        .catch((error: unknown) =>
          this.deps.logger.warn({ err: error, session: row.id }, 'snapshot pruning failed'),
        )
    return info
  }

  /**
   * A read-only snapshot of the workspace with the session's warm sandbox (if any) frozen. Returns
   * what the workspace and its sandbox looked like at that instant (for `unchangedSince`), when
   * both could be read.
   */
  frozenSnapshot(
    row: Pick<SessionRow, 'id' | 'tenant_id'>,
    snapshotId: string,
    options?: SnapshotOptions,
  ): Promise<WorkspaceMark | undefined> {
    return this.deps.runtime.snapshotWorkspace(row.id, snapshotId, row.tenant_id, options)
  }

  /** Automatic snapshots kept per session for the tenant. */
  async keepAuto(tenantId: string): Promise<number> {
    return (await this.deps.keepAutoSnapshots?.(tenantId)) ?? 50
  }

  /**
   * Applies keep-last-N to the session's automatic snapshots now, after the pruning already under
   * way (a retention pass: a lowered `keepAutoSnapshots` reaches sessions that run no new turn).
   * `deleting` is told of each snapshot just before it goes. Answers how many went, and how many
   * beyond the newest N were kept because a restore, fork or export was reading them.
   */
  pruneAuto(
    sessionId: string,
    tenantId: string,
    deleting?: (snapshot: SnapshotInfo) => Promise<void>,
  ): Promise<{ deleted: number; pinned: number }> {
    const work = this.retention.then(() => this.applyRetention(sessionId, tenantId, deleting))
    this.retention = work.then(
      () => undefined,
      () => undefined,
    )
    return work
  }

  private async applyRetention(
    sessionId: string,
    tenantId: string,
    deleting?: (snapshot: SnapshotInfo) => Promise<void>,
  ): Promise<{ deleted: number; pinned: number }> {
    const done = { deleted: 0, pinned: 0 }
    for (const old of await this.snapshots.expiredAuto(sessionId, await this.keepAuto(tenantId))) {
      // Claimed first (in the same tick as the pin check): a restore or fork can no longer pick it.
      if (!this.pins.claimForDeletion(old.id)) {
        done.pinned++
        continue
      }
      await deleting?.(old)
      // Should the removal fail, start-up's reconcile removes the unrecorded subvolume.
      await this.snapshots.markDeleted(old.id, this.now())
      await this.deps.runtime.deleteSnapshot(old.id)
      done.deleted++
    }
    return done
  }

  /** Waits for background snapshots and retention work (used on shutdown and by tests). */
  async settle(): Promise<void> {
    await Promise.all(this.pending.values())
    await this.retention
  }

  /** Removes one snapshot of the session (one its request took, when that request failed). */
  async drop(sessionId: string, snap: SnapshotInfo): Promise<void> {
    await this.snapshots.markDeleted(snap.id, this.now())
    this.snapshotDeleted(sessionId, snap.id)
    await this.deps.runtime.deleteSnapshot(snap.id)
  }

  /**
   * Removes a snapshot a failed request took, which its caller never learns of, unless a request
   * reads it meanwhile (a fork or restore by its ID, which found it listed): that one stays. A
   * failed removal is logged (start-up's reconcile removes an unrecorded subvolume).
   */
  async dropUnlessPinned(sessionId: string, snap: SnapshotInfo, what: string): Promise<void> {
    if (!this.pins.claimForDeletion(snap.id)) return
    await this.drop(sessionId, snap).catch((error: unknown) =>
      this.deps.logger.warn({ err: error, snapshot: snap.id }, `removing ${what} failed`),
    )
  }

  /** Removes every snapshot of a deleted session. */
  async deleteAll(sessionId: string): Promise<void> {
    await this.retention
    for (const snap of await this.snapshots.list(sessionId)) {
      await this.snapshots.markDeleted(snap.id, this.now())
      await this.deps.runtime.deleteSnapshot(snap.id)
    }
  }
}
