import { Readable } from 'node:stream'
import {
  CairnProblem,
  type MergeBody,
  type MergeChange,
  type MergeConflict,
  type MergeResult,
  newId,
  type SnapshotInfo,
} from '@cairn/protocol'
import type { TreeRef } from '@cairn/runtime/port'
import type { StorageReservation } from '../../limits/storage-budget.js'
import type { SessionRow } from '../../sessions/session-store.js'
import type { SnapshotPins } from '../../snapshots/snapshot-pins.js'
import type { SnapshotStore } from '../../snapshots/snapshot-store.js'
import type { HeavyReads } from '../heavy-reads.js'
import type { SnapshotPolicy } from '../snapshot-policy.js'
import { rollBack, SWAPS_WORKSPACE, type WorkspaceServiceDeps } from '../workspace-deps.js'
import { type MergePlan, MergePlanner, type MergeTrees } from './merge-plan.js'

/** A reservation's lease is renewed this often while the merge writes (the lease is 60 s). */
const RENEW_EVERY_MS = 20_000

/** The sessions of a merge, checked: the fork, its fork point, the target. */
/** The fork point and the fork's side of a merge. */
type Sides = Omit<MergeTrees, 'ours'>

interface Parties {
  fork: SessionRow
  base: SnapshotInfo
  target: SessionRow
}

/**
 * Merging a fork back: a three-way merge of the fork's workspace changes since its fork point
 * (the parent's snapshot it was forked from) into its parent or another session of the same
 * agent. The target is snapshotted first (restore that snapshot to undo), holds its turn lock
 * while the merge writes (`session_busy` otherwise), and records a `workspace_merged` event naming
 * the fork and its snapshot; files are written through the files API's sandboxed writer.
 */
export class WorkspaceMerge {
  constructor(
    private readonly deps: WorkspaceServiceDeps,
    private readonly snapshots: SnapshotStore,
    private readonly pins: SnapshotPins,
    private readonly policy: SnapshotPolicy,
    private readonly heavyReads: HeavyReads,
  ) {}

  async merge(tenantId: string, forkId: string, body: MergeBody): Promise<MergeResult> {
    const parties = await this.parties(tenantId, forkId, body.into)
    const strategy = body.strategy ?? 'keep'
    return this.pins.hold(parties.base.id, () =>
      this.withTheirs(parties.fork, body.snapshotId, async (theirs) => {
        const sides = { base: { snapshotId: parties.base.id }, theirs }
        const result = body.preview
          ? await this.preview(parties, sides, strategy)
          : await this.apply(tenantId, parties, sides, strategy, body.snapshotId ?? null)
        return {
          preview: body.preview === true,
          strategy,
          fork: { sessionId: parties.fork.id, snapshotId: body.snapshotId ?? null },
          base: { sessionId: parties.base.sessionId, snapshotId: parties.base.id },
          into: await this.deps.sessions.get(tenantId, parties.target.id),
          ...result,
        }
      }),
    )
  }

  /** The fork, its recorded fork point and the target, or the typed reason there is no merge. */
  private async parties(tenantId: string, forkId: string, into: string | undefined): Promise<Parties> {
    const fork = await this.deps.sessions.requireLive(tenantId, forkId)
    const parentId = fork.parent_session_id
    const snapshotId = fork.forked_from_snapshot_id
    const details = { parentSessionId: parentId, snapshotId }
    if (!parentId || !snapshotId)
      throw new CairnProblem(
        'merge_base_missing',
        `session ${fork.id} is not a fork: nothing records the snapshot it started from, so there is no base to merge against`,
        details,
      )
    const base = await this.snapshots.get(parentId, snapshotId)
    if (!base || !(await this.deps.runtime.hasTree({ snapshotId })))
      throw new CairnProblem(
        'merge_base_missing',
        `the fork point of ${fork.id} (snapshot ${snapshotId} of ${parentId}) is gone: there is no base to merge against`,
        details,
      )
    const targetId = into ?? parentId
    if (targetId === fork.id)
      throw new CairnProblem('validation_failed', `a session cannot be merged into itself (${fork.id})`)
    const target = await this.deps.sessions.requireLive(tenantId, targetId)
    if (target.agent_id !== fork.agent_id)
      throw new CairnProblem(
        'validation_failed',
        `session ${target.id} runs another agent than the fork ${fork.id}: merge into a session of the same agent`,
        { forkAgentId: fork.agent_id, targetAgentId: target.agent_id },
      )
    return { fork, base, target }
  }

  /**
   * Runs `fn` on the fork's side: the named snapshot (pinned), or its live workspace as a
   * temporary snapshot (frozen, O(1)) removed afterwards, so a turn running in the fork meanwhile
   * changes nothing the merge reads.
   */
  private async withTheirs<T>(
    fork: SessionRow,
    snapshotId: string | undefined,
    fn: (tree: TreeRef) => Promise<T>,
  ): Promise<T> {
    if (snapshotId) {
      if (!(await this.snapshots.get(fork.id, snapshotId)))
        throw new CairnProblem('not_found', `No snapshot ${snapshotId} in session ${fork.id}`)
      return this.pins.hold(snapshotId, () => fn({ snapshotId }))
    }
    return this.withTemporarySnapshot(fork, fn)
  }

  private async withTemporarySnapshot<T>(row: SessionRow, fn: (tree: TreeRef) => Promise<T>): Promise<T> {
    if (!(await this.deps.runtime.hasWorkspace(row.id)))
      throw await this.deps.sessions.missingWorkspace(row.tenant_id, row.id)
    const temp = newId('snapshot')
    await this.deps.sessions.readingWorkspace(row.tenant_id, row.id, () =>
      this.policy.frozenSnapshot(row, temp),
    )
    try {
      return await fn({ snapshotId: temp })
    } finally {
      await this.deps.runtime
        .deleteSnapshot(temp)
        .catch((e: unknown) =>
          this.deps.logger.warn({ err: e, snapshot: temp }, 'removing a merge snapshot failed'),
        )
    }
  }

  private plan(parties: Parties, trees: MergeTrees, strategy: MergeResult['strategy']): Promise<MergePlan> {
    const labels = {
      ours: `target ${parties.target.id}`,
      base: `fork point ${parties.base.id}`,
      theirs: `fork ${parties.fork.id}`,
    }
    return this.heavyReads.run(parties.target.tenant_id, 'a merge', () =>
      new MergePlanner(this.deps.runtime, trees, strategy, labels).run(),
    )
  }

  /** What the merge would do, read against a temporary snapshot of the target; nothing changes. */
  private async preview(
    parties: Parties,
    sides: Sides,
    strategy: MergeResult['strategy'],
  ): Promise<Pick<MergeResult, 'snapshot' | 'changes' | 'conflicts'>> {
    const plan = await this.withTemporarySnapshot(parties.target, (ours) =>
      this.plan(parties, { ...sides, ours }, strategy),
    )
    return { snapshot: null, changes: changesOf(plan), conflicts: plan.conflicts }
  }

  /**
   * Under the target's turn lock: the pre-merge snapshot (also the tree the merge reads as the
   * target's), the plan, the writes; a failure part-way restores the pre-merge snapshot.
   */
  private async apply(
    tenantId: string,
    parties: Parties,
    sides: Sides,
    strategy: MergeResult['strategy'],
    forkSnapshotId: string | null,
  ): Promise<Pick<MergeResult, 'snapshot' | 'changes' | 'conflicts'>> {
    const { target } = parties
    await this.policy.settled(target.id)
    return this.deps.sessions.exclusive(
      tenantId,
      target.id,
      'a merge',
      async (row) => {
        const before = await this.deps.manualSnapshotCap.within(row, (snapshotId) =>
          this.policy.take(row, 'manual', 'before_merge', row.turn_count, undefined, snapshotId),
        )
        const plan = await this.plan(parties, { ...sides, ours: { snapshotId: before.id } }, strategy)
        const written = await this.rollingBack(row, before, () => this.write(row, sides.theirs, plan))
        const from = forkSnapshotId ? `its snapshot ${forkSnapshotId}` : 'its workspace'
        await this.deps.sessions.recordWorkspaceEvent(
          row,
          'workspace_merged',
          `from fork ${parties.fork.id} (${from}), fork point ${parties.base.id}: ${written.changes.length} file(s) changed, ${written.conflicts.length} conflict(s) (undo: restore ${before.id})`,
        )
        await this.deps.sessions.touch(row.id)
        return { snapshot: before, ...written }
      },
      SWAPS_WORKSPACE,
    )
  }

  /** Runs the writes; on a failure, the workspace goes back to the pre-merge snapshot. */
  private async rollingBack<T>(row: SessionRow, before: SnapshotInfo, work: () => Promise<T>): Promise<T> {
    try {
      return await work()
    } catch (error) {
      throw await rollBack(this.deps, row, before, error)
    }
  }

  /**
   * Writes and deletes through the files API's sandboxed writer, the bytes reserved in the
   * tenant's storage budget first. A file whose place in the target turns out not to take it
   * (a file where the fork has a directory: 409 from the writer) becomes a `type` conflict.
   */
  private async write(
    row: SessionRow,
    theirs: TreeRef,
    plan: MergePlan,
  ): Promise<{ changes: MergeChange[]; conflicts: MergeConflict[] }> {
    const changes: MergeChange[] = []
    const conflicts = [...plan.conflicts]
    if (plan.writes.length + plan.deletes.length === 0) return { changes, conflicts }
    const bytes = plan.writes.reduce((sum, w) => sum + w.bytes, 0)
    const budget = this.deps.storageBudget
    const reservation = budget ? await budget.reserve(row.tenant_id, bytes, 'a merge') : undefined
    const renew = renewer(
      reservation,
      () => this.deps.clock.now(),
      (r) => budget?.renew(r),
    )
    this.policy.changed(row.id)
    try {
      for (const planned of plan.writes) {
        const { path, action, how } = planned
        const body = planned.content
          ? Readable.from([planned.content])
          : (await this.deps.runtime.openFile(theirs, Buffer.from(path), { background: true })).stream
        try {
          await this.deps.runtime.writeFile(row.id, path, body)
          changes.push({ path, action, how })
        } catch (error) {
          body.destroy()
          if (!(error instanceof CairnProblem && error.code === 'conflict')) throw error
          conflicts.push({ path, kind: 'type', binary: false, resolution: 'keep', reason: error.message })
        }
        await renew()
      }
      for (const path of plan.deletes) {
        await this.deps.runtime.deletePath(row.id, path)
        changes.push({ path, action: 'delete', how: 'taken' })
      }
      await this.deps.sessions.advanceGeneration(row.id)
    } finally {
      if (reservation) await budget?.release(reservation)
    }
    return { changes, conflicts }
  }
}

/** Renews a reservation at most every RENEW_EVERY_MS as the writes go on. */
function renewer(
  reservation: StorageReservation | undefined,
  nowMs: () => number,
  renew: (r: StorageReservation) => Promise<void> | undefined,
): () => Promise<void> {
  let last = nowMs()
  return async () => {
    if (!reservation || nowMs() - last < RENEW_EVERY_MS) return
    last = nowMs()
    await renew(reservation)
  }
}

function changesOf(plan: MergePlan): MergeChange[] {
  return [
    ...plan.writes.map(({ path, action, how }) => ({ path, action, how })),
    ...plan.deletes.map((path) => ({ path, action: 'delete' as const, how: 'taken' as const })),
  ]
}
