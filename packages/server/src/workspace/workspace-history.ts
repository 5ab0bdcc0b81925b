import {
  CairnProblem,
  type ForkBody,
  type ForksBody,
  type ForksResult,
  newId,
  type RestoreBody,
  type SessionInfo,
  type SnapshotInfo,
} from '@cairn/protocol'
import { iso } from '../clock.js'
import { checkMemoryCapable } from '../pause/pause-policy.js'
import { applyPolicy, policyOf } from '../sessions/policy.js'
import type { SessionRow } from '../sessions/session-store.js'
import type { SnapshotPins } from '../snapshots/snapshot-pins.js'
import type { SnapshotStore } from '../snapshots/snapshot-store.js'
import type { SnapshotExtras, SnapshotMeasures } from './snapshot-measures.js'
import type { SnapshotPolicy } from './snapshot-policy.js'
import { SWAPS_WORKSPACE, type WorkspaceServiceDeps } from './workspace-deps.js'

/** Session events after which the session's node may not hold its earlier snapshots. */
const MOVES = ['moved', 'node_recovered']

/**
 * A session's snapshots as its history: manual snapshots, listing and deleting them, exact
 * restore, undo and fork. Every mutation holds the session's turn lock.
 */
export class WorkspaceHistory {
  constructor(
    private readonly deps: WorkspaceServiceDeps,
    private readonly snapshots: SnapshotStore,
    private readonly pins: SnapshotPins,
    private readonly policy: SnapshotPolicy,
    private readonly measures: SnapshotMeasures,
  ) {}

  private now(): string {
    return iso(this.deps.clock.now())
  }

  async snapshot(
    tenantId: string,
    id: string,
    label?: string,
    options: { memory?: boolean } = {},
  ): Promise<SnapshotInfo> {
    await this.policy.settled(id)
    return this.deps.sessions.exclusive(tenantId, id, 'a snapshot', (row) =>
      this.deps.manualSnapshotCap.within(row, async (snapshotId) => {
        if (options.memory) await this.requireMemorySnapshot(row)
        const snap = await this.policy.take(row, 'manual', 'manual', row.turn_count, label, snapshotId)
        if (options.memory) await this.keepMemory(row, snap)
        return snap
      }),
    )
  }

  /**
   * Refuses a snapshot with memory the session cannot give: its agent's driver cannot checkpoint
   * memory (`bad_request`, the driver's reason), or no sandbox of its runs (`sandbox_not_running`).
   */
  private async requireMemorySnapshot(row: SessionRow): Promise<void> {
    const revision = await this.deps.agents.store.revision(row.revision_id)
    if (revision) await checkMemoryCapable(revision.manifest, this.deps.runtime, 'a snapshot with memory')
    this.refuseExpiredSecrets(row, 'a snapshot with memory')
    const agent = await this.deps.runtime.agent(row.id)
    if (!agent?.alive)
      throw new CairnProblem(
        'sandbox_not_running',
        `session ${row.id} has no running sandbox: a snapshot with memory keeps a running sandbox's state (send it a message first)`,
      )
    if (!agent.checkpointable)
      throw new CairnProblem(
        'bad_request',
        `session ${row.id}'s sandbox cannot be checkpointed: only a pause: memory session's sandbox can (create the session with pause: memory)`,
        { pause: row.pause },
      )
  }

  /**
   * Memory carries the secrets the sandbox was started with: one that expired since must not reach
   * a fork through it (an expired secret is never handed to a new sandbox). `conflict` until the
   * session's next message has replaced its sandbox without it.
   */
  private refuseExpiredSecrets(row: SessionRow, what: string): void {
    if (!this.deps.sessions.sandboxSecretsExpired(row.id)) return
    throw new CairnProblem(
      'conflict',
      `session ${row.id}'s sandbox was started with a secret that has expired since, and its memory holds it: ${what} would hand it on; send the session a message first (its sandbox is then started again without it)`,
      { reason: 'secret_expired' },
    )
  }

  /** Checkpoints the session's sandbox as the snapshot's memory; a failure deletes the snapshot too. */
  private async keepMemory(row: SessionRow, snap: SnapshotInfo): Promise<void> {
    try {
      const { bytes, checkpointMs } = await this.deps.runtime.checkpointForSnapshot(row.id, snap.id)
      await this.deps.sessions.store.note(
        { id: row.id, status: row.status },
        'memory_paused',
        this.now(),
        `checkpoint of ${bytes} bytes in ${checkpointMs} ms kept with snapshot ${snap.id}; the next message restores it`,
      )
    } catch (error) {
      await this.policy.drop(row.id, snap)
      throw error
    }
  }

  /**
   * A session's snapshots; `digest` computes each missing content digest, `sizes` measures each
   * one's referenced and exclusive bytes.
   */
  async list(
    tenantId: string,
    id: string,
    want: SnapshotExtras = {},
    signal?: AbortSignal,
  ): Promise<SnapshotInfo[]> {
    await this.deps.sessions.requireOwned(tenantId, id)
    const all = await this.snapshots.list(id)
    if (!want.digest && !want.sizes) return all
    const out: SnapshotInfo[] = []
    for (const snap of all) out.push(await this.measures.withExtras(tenantId, snap, want, signal))
    return out
  }

  async getSnapshot(
    tenantId: string,
    id: string,
    snapshotId: string,
    want: SnapshotExtras = {},
    signal?: AbortSignal,
  ) {
    await this.deps.sessions.requireOwned(tenantId, id)
    const snap = await this.snapshots.get(id, snapshotId)
    if (!snap) throw new CairnProblem('not_found', `No snapshot ${snapshotId} in session ${id}`)
    return this.measures.withExtras(tenantId, snap, want, signal)
  }

  /**
   * Deletes one snapshot and frees what it alone held (btrfs frees it in the background, within
   * seconds). Refused with `snapshot_in_use` while a restore, fork or export reads it; marked
   * deleted in the same tick as that check, so none can pick it afterwards.
   */
  async deleteSnapshot(tenantId: string, id: string, snapshotId: string): Promise<void> {
    await this.deps.sessions.requireOwned(tenantId, id)
    const snap = await this.snapshots.get(id, snapshotId)
    if (!snap) throw new CairnProblem('not_found', `No snapshot ${snapshotId} in session ${id}`)
    if (!this.pins.claimForDeletion(snap.id)) {
      throw new CairnProblem(
        'snapshot_in_use',
        `snapshot ${snap.id} is being read by a restore, fork or export; try again once it is done`,
      )
    }
    await this.snapshots.markDeleted(snap.id, this.now())
    this.policy.snapshotDeleted(id, snap.id)
    await this.deps.runtime.deleteSnapshot(snap.id)
  }

  private async pick(
    row: SessionRow,
    body: { snapshotId?: string | undefined; turn?: number | undefined },
  ): Promise<SnapshotInfo> {
    if (body.snapshotId) {
      const found = await this.snapshots.get(row.id, body.snapshotId)
      if (!found) throw new CairnProblem('not_found', `No snapshot ${body.snapshotId} in session ${row.id}`)
      return found
    }
    if (body.turn !== undefined) {
      const found = await this.snapshots.atTurn(row.id, body.turn)
      if (!found)
        throw new CairnProblem('not_found', `No snapshot of session ${row.id} follows turn ${body.turn}`)
      return found
    }
    throw new CairnProblem('validation_failed', 'give snapshotId or turn')
  }

  /** Replaces the workspace with the snapshot (the warm sandbox is stopped first). */
  async restore(
    tenantId: string,
    id: string,
    body: RestoreBody,
  ): Promise<{ session: SessionInfo; snapshot: SnapshotInfo }> {
    await this.policy.settled(id)
    return this.deps.sessions.exclusive(
      tenantId,
      id,
      'a restore',
      async (row) => {
        const target = await this.pick(row, body)
        // Pinned from the moment it is picked: retention leaves it alone until the restore is done.
        return this.pins.hold(target.id, async () => {
          if (body.policy) this.deps.sessions.validatePolicy(row, body.policy)
          this.policy.replaced(id)
          await this.deps.sessions.stopSandbox(id)
          // A restore is a new generation (the marker is set on the incoming copy before the swap).
          const generation = (await this.deps.sessions.store.generationOf(id)) + 1
          await this.fromSnapshot(target, () =>
            this.deps.runtime.restoreWorkspace(id, target.id, generation, row.tenant_id),
          )
          await this.deps.sessions.setGeneration(id, generation)
          await this.deps.sessions.recordWorkspaceEvent(
            row,
            'workspace_restored',
            `${target.id} (after turn ${target.turn}), generation ${generation}`,
          )
          if (body.policy)
            await this.deps.sessions.updatePolicy(
              await this.deps.sessions.requireOwned(tenantId, id),
              body.policy,
              false,
            )
          return { session: await this.deps.sessions.get(tenantId, id), snapshot: target }
        })
      },
      SWAPS_WORKSPACE,
    )
  }

  /**
   * Runs a copy from a pinned snapshot. Retention marks a snapshot deleted before it removes it
   * and never touches a pinned one, so a picked snapshot stays; should it vanish all the same (an
   * operator's hand in the pool), the copy says so instead of failing with a 500 storage error.
   */
  private async fromSnapshot<T>(snap: SnapshotInfo, copy: () => Promise<T>): Promise<T> {
    try {
      return await copy()
    } catch (error) {
      if (!(await this.deps.runtime.hasTree({ snapshotId: snap.id }))) throw await this.missing(snap)
      throw error
    }
  }

  /**
   * Why the session's node does not hold a snapshot: the session moved since it was taken (a
   * move carries the workspace, not the snapshots before it: `snapshot_left_behind`, naming the
   * move), or it is gone (`not_found`).
   */
  private async missing(snap: SnapshotInfo): Promise<CairnProblem> {
    const takenMs = Date.parse(snap.createdAt)
    const move = (await this.deps.sessions.store.events(snap.sessionId)).find(
      (event) => MOVES.includes(event.cause) && Date.parse(event.at) >= takenMs,
    )
    if (!move)
      return new CairnProblem(
        'not_found',
        `snapshot ${snap.id} is gone from the storage pool; list the snapshots and pick another`,
      )
    return new CairnProblem(
      'snapshot_left_behind',
      `snapshot ${snap.id} was taken before session ${snap.sessionId} moved to another node (${move.cause} at ${move.at}: ${move.detail ?? ''}); a move carries the workspace, not the snapshots before it, which stay in the old node's pool: move the session back to that node to use it, or pick a snapshot taken since`,
      { snapshotId: snap.id, movedAt: move.at, move: move.detail },
    )
  }

  /** Restores the snapshot taken before the last turn. */
  async undo(tenantId: string, id: string): Promise<{ session: SessionInfo; snapshot: SnapshotInfo }> {
    await this.policy.settled(id)
    // A deleted session's snapshots went with it: said as deleted, not as no snapshot before the turn.
    const row = await this.deps.sessions.requireLive(tenantId, id)
    if (row.turn_count === 0) throw new CairnProblem('conflict', `session ${id} has no turn to undo`)
    const before = await this.snapshots.atTurn(id, row.turn_count - 1)
    if (!before)
      throw new CairnProblem('not_found', `no snapshot before turn ${row.turn_count} of session ${id}`)
    return this.restore(tenantId, id, { snapshotId: before.id })
  }

  /**
   * `count` forks of the session as it is now, all from one snapshot. With `memory`, the session's
   * running state is checkpointed first (its sandbox stops, so nothing it runs writes after that
   * instant) or taken from its pause, then its workspace is snapshotted and the checkpoint kept as
   * the snapshot's memory, all under the turn lock: files and memory are of the same instant. The
   * session itself goes on from there at its next message (its sandbox is restored).
   */
  async forks(tenantId: string, id: string, body: ForksBody): Promise<ForksResult> {
    await this.policy.settled(id)
    const memory = body.memory === true
    let parentId = id
    const snap = await this.deps.sessions.exclusive(tenantId, id, 'a fork', (row) => {
      parentId = row.id
      return this.deps.manualSnapshotCap.within(row, (snapshotId) =>
        memory
          ? this.snapshotWithMemory(row, body.label, snapshotId)
          : this.policy.take(row, 'manual', 'manual', row.turn_count, body.label, snapshotId),
      )
    })
    const { title, policy } = body
    const fork: ForkBody = { snapshotId: snap.id, ...(title ? { title } : {}), ...(policy ? { policy } : {}) }
    const sessions: SessionInfo[] = []
    try {
      for (let i = 0; i < (body.count ?? 1); i++) sessions.push(await this.fork(tenantId, id, fork))
    } catch (error) {
      throw await this.undoForks(tenantId, parentId, snap, sessions, error)
    }
    return { snapshot: snap, memory, sessions }
  }

  /**
   * All or none: a forks request that fails part way (its parent deleted meanwhile, a fork
   * refused) answers its error, so what it made, which its caller never learns of, goes with it:
   * the forks, and the snapshot it took (else it stayed, counted toward the manual snapshot cap).
   * Returns the error to answer.
   */
  private async undoForks(
    tenantId: string,
    parentId: string,
    snap: SnapshotInfo,
    made: SessionInfo[],
    error: unknown,
  ): Promise<unknown> {
    const { logger } = this.deps
    for (const fork of made)
      await this.deps.sessions
        .delete(tenantId, fork.id)
        .catch((e: unknown) => logger.warn({ err: e, session: fork.id }, 'removing a fork failed'))
    // Its parent deleted meanwhile took the snapshot with it: said as a deleted session, not
    // as a snapshot not found.
    const gone = await this.deps.sessions.missingWorkspace(tenantId, parentId)
    if (gone.code === 'session_deleted') return gone
    await this.policy.dropUnlessPinned(parentId, snap, 'the snapshot of failed forks')
    return error
  }

  private async snapshotWithMemory(
    row: SessionRow,
    label: string | undefined,
    snapshotId: string,
  ): Promise<SnapshotInfo> {
    const revision = await this.deps.agents.store.revision(row.revision_id)
    if (revision)
      await checkMemoryCapable(
        revision.manifest,
        this.deps.runtime,
        'a fork with memory',
        'capability_unavailable',
      )
    this.refuseExpiredSecrets(row, 'a fork with memory')
    const held = await this.deps.runtime.checkpointForFork(row.id)
    if (!held.wasPaused)
      await this.deps.sessions.store.note(
        { id: row.id, status: row.status },
        'memory_paused',
        this.now(),
        `checkpoint of ${held.bytes} bytes in ${held.checkpointMs} ms for a fork with memory; the next message restores it`,
      )
    const snap = await this.policy.take(row, 'manual', 'manual', row.turn_count, label, snapshotId)
    try {
      await this.deps.runtime.keepSnapshotMemory(row.id, snap.id, row.tenant_id)
    } catch (error) {
      await this.policy.drop(row.id, snap)
      throw error
    }
    return snap
  }

  /** A new session whose workspace is the snapshot and whose transcript is the parent's up to its turn. */
  async fork(tenantId: string, id: string, body: ForkBody): Promise<SessionInfo> {
    await this.policy.settled(id)
    // A deleted session (its snapshots went with it) is said as deleted, as every other fork path
    // says it, not as a snapshot not found.
    const row = await this.deps.sessions.requireLive(tenantId, id)
    const source = await this.pick(row, body).catch(async (error: unknown) => {
      const gone = await this.deps.sessions.missingWorkspace(tenantId, row.id)
      throw gone.code === 'session_deleted' ? gone : error
    })
    // Asked by turn, the snapshot may be one taken earlier that also stands for that turn (the
    // turns between wrote nothing): the transcript still goes up to the turn asked for.
    const turnsUpTo = body.snapshotId ? source.turn : (body.turn ?? source.turn)
    // The fork inherits the parent's whole policy; the request may override any of it.
    const policy = applyPolicy(policyOf(row), body.policy)
    if (policy.maxTurns !== null && source.turn >= policy.maxTurns) {
      throw new CairnProblem(
        'turn_limit_reached',
        `a fork at turn ${source.turn} would have no turn left under maxTurns ${policy.maxTurns}; give a higher policy.maxTurns (or null)`,
        { maxTurns: policy.maxTurns, turnCount: source.turn },
      )
    }
    const childId = newId('session')
    await this.pins.hold(source.id, () =>
      this.fromSnapshot(source, () => this.deps.runtime.forkWorkspace(childId, source.id, row.tenant_id)),
    )
    try {
      // The snapshot carries the marker of the generation it was taken at; the child starts there.
      const [marked] = await this.deps.runtime.readGenerations([childId])
      const generation = marked ?? source.generation
      if (marked === undefined) await this.deps.runtime.writeGeneration(childId, generation)
      // A snapshot with memory: the fork's first message restores its running state.
      await this.deps.runtime.forkMemory(source.id, childId, generation)
      await this.deps.sessions.insertFork(
        row,
        { id: childId, title: body.title, policy, generation },
        { snapshotId: source.id, turnsUpTo },
      )
    } catch (error) {
      // The fork's error is the one to answer; a half-made child workspace left behind is logged.
      await this.deps.runtime
        .deleteWorkspace(childId)
        .catch((e: unknown) =>
          this.deps.logger.warn({ err: e, workspace: childId }, 'removing a failed fork failed'),
        )
      throw error
    }
    return await this.deps.sessions.get(tenantId, childId)
  }
}
