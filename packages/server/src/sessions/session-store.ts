import {
  CairnProblem,
  newId,
  type SessionPolicy,
  type SessionStatus,
  type SetupStatus,
  type StatusCause,
  type TurnStatus,
} from '@cairn/protocol'
import { type QueryCreator, sql } from 'kysely'
import { type Db, isUniqueViolation } from '../db/database.js'
import type { Schema } from '../db/schema.js'
import { standingFor } from '../snapshots/snapshot-store.js'
import { DeadlineIndex, nextDueColumn, refreshNextDue } from './deadline-index.js'
import { NetworkLog } from './network-log.js'
import { recoverAfterRestart } from './restart-recovery.js'
import { SessionHolds } from './session-holds.js'
import type { InterruptedTurn, ListFilter, NewSession, SessionRow } from './session-rows.js'
import {
  type ChangedTiming,
  changeStatus,
  STATUS_TIMING,
  type StatusChange,
  type StatusUpdate,
  TurnEndedElsewhere,
  type TurnEndRow,
  type TurnWrites,
} from './status-writes.js'
import { MOVE_OPERATION } from './turn-locks.js'
import { TurnRecords } from './turn-records.js'

export { type InterruptedTurn, type ListFilter, type SessionRow, toSessionInfo } from './session-rows.js'
export { TurnEndedElsewhere } from './status-writes.js'
export type { StoredTurn } from './turn-records.js'

/** Sessions, turns and status events. */
export class SessionStore {
  private readonly timingListeners: ((sessionId: string, dueMs?: number) => void)[] = []
  /** When sessions time out, indexed: the timeouts this store's replica acts on. */
  readonly deadlines: DeadlineIndex
  private readonly holds: SessionHolds
  private readonly reads: TurnRecords
  /** The session's network log: the egress proxy's decisions. */
  readonly networkLog: NetworkLog

  constructor(
    private readonly db: Db,
    /** This replica's runtime: sessions are made on it, and start-up and timeouts act on its own. */
    readonly runtimeId: string,
    /** Routing (`--role api`): a new session's node, where its workspace was placed. */
    private readonly placedNode?: ((sessionId: string) => string | undefined) | undefined,
  ) {
    this.deadlines = new DeadlineIndex(db, placedNode === undefined ? runtimeId : undefined)
    this.holds = new SessionHolds(db)
    this.reads = new TurnRecords(db)
    this.networkLog = new NetworkLog(db)
  }

  /**
   * Whether timeouts act on every session (an API replica, whose sessions all live on nodes: its
   * leader reaps them) rather than on this runtime's own.
   */
  get everySession(): boolean {
    return this.placedNode !== undefined
  }

  /** Sessions recorded before owners were (or by an older server) become this runtime's. */
  async claimUnowned(): Promise<number> {
    const result = await this.db.q
      .updateTable('sessions')
      .set({ runtime_id: this.runtimeId })
      .where('runtime_id', 'is', null)
      .executeTakeFirst()
    return Number(result.numUpdatedRows)
  }

  /**
   * Called after a change that may bring a session's next timeout earlier (a new session, a
   * status change, a new policy, a lease), once it is committed; changes that only move it later
   * (activity) are not reported: a timer armed for the old time finds nothing due and looks again.
   * `dueMs`: the session's next timeout when the change knew it (else the listener reads it).
   */
  onTimingChange(listener: (sessionId: string, dueMs?: number) => void): void {
    this.timingListeners.push(listener)
  }

  private timingChanged(sessionId: string, dueMs?: number): void {
    this.db.afterCommit(() => {
      for (const listener of this.timingListeners) listener(sessionId, dueMs)
    })
  }

  /** `changeStatus` (status-writes.ts), the reaper told when the timeout came earlier. */
  private changeStatus(
    sessionId: string,
    update: (qc: QueryCreator<Schema>) => StatusUpdate,
    change: StatusChange,
    turn: TurnWrites = {},
  ): Promise<ChangedTiming | undefined> {
    return changeStatus(this.db, sessionId, update, change, turn, (dueMs) =>
      this.timingChanged(sessionId, dueMs),
    )
  }

  private selectSession() {
    return this.db.q
      .selectFrom('sessions as s')
      .innerJoin('agents as a', 'a.id', 's.agent_id')
      .selectAll('s')
      .select('a.name as agent_name')
  }

  async get(tenantId: string, id: string): Promise<SessionRow | undefined> {
    return (await this.selectSession()
      .where('s.tenant_id', '=', tenantId)
      .where('s.id', '=', id)
      .executeTakeFirst()) as SessionRow | undefined
  }

  /**
   * The session as a turn begins from it: its row, the state of its setup phase (null: it has
   * none) and whether a snapshot stands for the state the turn starts from, in one statement.
   */
  async getForTurn(tenantId: string, id: string): Promise<TurnSessionRow | undefined> {
    return (await this.selectSession()
      .select((eb) =>
        eb
          .selectFrom('session_setups')
          .select('status')
          .whereRef('session_setups.session_id', '=', 's.id')
          .as('setup_status'),
      )
      .select((eb) =>
        eb
          .exists(
            eb
              .selectFrom('snapshots')
              .select(sql`1`.as('one'))
              .whereRef('snapshots.session_id', '=', 's.id')
              .where('snapshots.deleted_at', 'is', null)
              .where(standingFor(sql`s.turn_count`)),
          )
          .as('snapshot_stands'),
      )
      .where('s.tenant_id', '=', tenantId)
      .where('s.id', '=', id)
      .executeTakeFirst()) as TurnSessionRow | undefined
  }

  /** The session's status, whoever's it is (events the runtime reports by session ID). */
  async statusOf(id: string): Promise<SessionRow['status'] | undefined> {
    const row = await this.db.q
      .selectFrom('sessions')
      .select('status')
      .where('id', '=', id)
      .executeTakeFirst()
    return row?.status as SessionRow['status'] | undefined
  }

  async insert(
    row: NewSession,
    fork?: { parentId: string; snapshotId: string; turnsUpTo: number },
  ): Promise<void> {
    await this.db.transaction(async () => {
      await this.db.q
        .insertInto('sessions')
        .values({
          auto_snapshots: 1,
          network_json: null,
          ephemeral: 0,
          keep_transcript: 1,
          generation: 0,
          ...row,
          runtime_id: this.placedNode?.(row.id) ?? this.runtimeId,
          updated_at: row.created_at,
          last_active_at: row.created_at,
          next_due_at: nextDueColumn({
            status: row.status,
            last_active_at: row.created_at,
            idle_timeout_ms: row.idle_timeout_ms,
            lease_until: null,
            deadline_at: row.deadline_at,
          }),
        })
        .execute()
      await this.insertEvent(
        row.id,
        null,
        row.status,
        row.status_cause,
        fork ? `forked from ${fork.parentId} at ${fork.snapshotId}` : null,
        row.created_at,
      )
      if (fork) await this.reads.copyIntoFork(fork.parentId, row.id, fork.turnsUpTo, fork.snapshotId)
    })
    this.timingChanged(row.id)
  }

  private async insertEvent(
    sessionId: string,
    from: string | null,
    to: string,
    cause: string,
    detail: string | null,
    at: string,
  ): Promise<void> {
    await this.db.q
      .insertInto('session_events')
      .values({
        id: newId('event'),
        session_id: sessionId,
        from_status: from,
        to_status: to,
        cause,
        detail,
        at,
      })
      .execute()
  }

  deleteTranscript(sessionId: string): Promise<void> {
    return this.reads.deleteTranscript(sessionId)
  }
  deleteTurnEvents(sessionId: string): Promise<void> {
    return this.reads.deleteTurnEvents(sessionId)
  }

  /** Records the workspace generation; it only moves forward (a lower value is ignored). */
  async setGeneration(sessionId: string, generation: number): Promise<void> {
    await this.db.q
      .updateTable('sessions')
      .set({ generation })
      .where('id', '=', sessionId)
      .where('generation', '<', generation)
      .execute()
  }

  async generationOf(sessionId: string): Promise<number> {
    const row = await this.db.q
      .selectFrom('sessions')
      .select('generation')
      .where('id', '=', sessionId)
      .executeTakeFirst()
    return row?.generation ?? 0
  }

  /** Stores a session's lifecycle policy and the deadline `maxDurationMs` gives it. */
  async setPolicy(
    sessionId: string,
    policy: SessionPolicy,
    deadlineAt: string | null,
    at: string,
  ): Promise<void> {
    await this.db.transaction(async () => {
      await this.db.q
        .updateTable('sessions')
        .set({
          idle_timeout_ms: policy.idleTimeoutMs,
          keep_warm_ms: policy.keepWarmMs,
          max_turns: policy.maxTurns,
          max_duration_ms: policy.maxDurationMs,
          on_timeout: policy.onTimeout,
          approval_timeout_ms: policy.approvalTimeoutMs,
          deadline_at: deadlineAt,
          updated_at: at,
        })
        .where('id', '=', sessionId)
        .execute()
      await refreshNextDue(this.db, sessionId)
    })
    this.timingChanged(sessionId)
  }

  /** Changes a session's status and records the transition with its cause, atomically. */
  async transition(
    row: Pick<SessionRow, 'id' | 'status'>,
    to: SessionStatus,
    cause: StatusCause,
    at: string,
    detail?: string,
  ): Promise<void> {
    await this.db.transaction(() =>
      this.changeStatus(
        row.id,
        (qc) =>
          qc
            .updateTable('sessions')
            .set({ status: to, status_cause: cause, updated_at: at })
            .where('id', '=', row.id)
            .returning(STATUS_TIMING),
        { from: row.status, to, cause, detail, at },
      ),
    )
  }

  /** Records an event that leaves the status as it is (a sandbox paused or restored, and why). */
  async note(
    row: Pick<SessionRow, 'id' | 'status'>,
    cause: StatusCause,
    at: string,
    detail: string,
  ): Promise<void> {
    await this.insertEvent(row.id, row.status, row.status, cause, detail, at)
  }

  async list(tenantId: string, filter: ListFilter): Promise<SessionRow[]> {
    let query = this.selectSession().where('s.tenant_id', '=', tenantId)
    if (filter.agentId) query = query.where('s.agent_id', '=', filter.agentId)
    query = filter.status
      ? query.where('s.status', '=', filter.status)
      : query.where('s.status', '!=', 'deleted')
    const cursor = filter.cursor
    if (cursor)
      query = query.where((eb) =>
        eb.or([
          eb('s.created_at', '<', cursor.createdAt),
          eb.and([eb('s.created_at', '=', cursor.createdAt), eb('s.id', '<', cursor.id)]),
        ]),
      )
    return (await query
      .orderBy('s.created_at', 'desc')
      .orderBy('s.id', 'desc')
      .limit(filter.limit)
      .execute()) as SessionRow[]
  }

  async resolvePrefix(tenantId: string, prefix: string, max: number): Promise<string[]> {
    const rows = await this.db.q
      .selectFrom('sessions')
      .select('id')
      .where('tenant_id', '=', tenantId)
      .where('id', '>=', prefix)
      .where('id', '<', `${prefix}~`)
      .where('status', '!=', 'deleted')
      .orderBy('id')
      .limit(max)
      .execute()
    return rows.map((r) => r.id)
  }

  /**
   * Records a new running turn and the session's `idle → active` transition (one update of its
   * row). The database holds at most one running turn per session (a partial unique index): a
   * second one, from this process or another replica, is refused with `session_busy` and nothing
   * of it is recorded. `sandboxId`: the warm sandbox the turn is expected to run in, if known.
   */
  async startTurn(turn: {
    sessionId: string
    turnId: string
    seq: number
    prompt: string
    title: string
    at: string
    relayId: string | null
    sandboxId?: string | undefined
  }): Promise<void> {
    const { sessionId, at } = turn
    const row = {
      id: turn.turnId,
      session_id: sessionId,
      seq: turn.seq,
      status: 'running',
      prompt: turn.prompt,
      started_at: at,
      relay_id: turn.relayId,
      ...(turn.sandboxId === undefined ? {} : { sandbox_id: turn.sandboxId, cold_start: 0 }),
    }
    const onPostgres = this.db.dialect === 'postgres'
    // PostgreSQL: one statement (the turn's row written from the session's, so a held session
    // writes neither), atomic without a transaction. SQLite: the turn's row first, in one.
    const begin = async () => {
      if (!onPostgres) await this.db.q.insertInto('turns').values(row).execute()
      const timing = await this.changeStatus(
        sessionId,
        (qc) =>
          qc
            .updateTable('sessions')
            .set((eb) => ({
              turn_count: eb('turn_count', '+', 1),
              message_count: eb('message_count', '+', 1),
              title: eb.fn.coalesce('title', eb.val(turn.title)),
              last_active_at: at,
              updated_at: at,
              status: 'active',
              status_cause: 'turn_started',
            }))
            .where('id', '=', sessionId)
            .where((eb) =>
              eb.or([eb('held_by', 'is', null), eb('held_until', '<', this.holds.holdClock(at))]),
            )
            .returning(STATUS_TIMING),
        { from: 'idle', to: 'active', cause: 'turn_started', detail: turn.turnId, at },
        onPostgres ? { begun: row } : {},
      )
      if (!timing) {
        // An exclusive operation holds the session (through any replica): the turn is not begun.
        const held = await this.heldFor(sessionId, at)
        throw held === MOVE_OPERATION
          ? new CairnProblem(
              'session_moving',
              `session ${sessionId} is being moved to another node; retry in a moment`,
            )
          : new CairnProblem(
              'session_busy',
              `session ${sessionId} is busy with ${held ?? 'an operation'}; retry when it is done`,
            )
      }
    }
    try {
      await (onPostgres ? begin() : this.db.transaction(begin))
    } catch (error) {
      if (isUniqueViolation(error))
        throw new CairnProblem(
          'session_busy',
          `session ${sessionId} is already running a turn; wait for it or cancel it`,
        )
      throw error
    }
  }

  /** The session's holds for exclusive operations (see SessionHolds). */
  hold(...args: Parameters<SessionHolds['hold']>) {
    return this.holds.hold(...args)
  }
  renewHold(...args: Parameters<SessionHolds['renewHold']>) {
    return this.holds.renewHold(...args)
  }
  releaseHold(...args: Parameters<SessionHolds['releaseHold']>) {
    return this.holds.releaseHold(...args)
  }
  heldFor(...args: Parameters<SessionHolds['heldFor']>) {
    return this.holds.heldFor(...args)
  }
  swaps(...args: Parameters<SessionHolds['swaps']>) {
    return this.holds.swaps(...args)
  }

  async setTurnSandbox(turnId: string, sandboxId: string, coldStart: boolean): Promise<void> {
    await this.db.q
      .updateTable('turns')
      .set({ sandbox_id: sandboxId, cold_start: coldStart ? 1 : 0 })
      .where('id', '=', turnId)
      .execute()
  }

  /**
   * The session's owner epoch, its row locked for the rest of the enclosing transaction (on
   * PostgreSQL; SQLite has one writer at a time): a write made only while it is unchanged cannot
   * land after the session's owner was declared lost or changed.
   */
  async ownerEpochForUpdate(sessionId: string): Promise<number | undefined> {
    let query = this.db.q.selectFrom('sessions').select('owner_epoch').where('id', '=', sessionId)
    if (this.db.dialect === 'postgres') query = query.forUpdate()
    const row = await query.executeTakeFirst()
    return row === undefined ? undefined : Number(row.owner_epoch)
  }

  /**
   * The error code of a turn someone else ended while it ran (its relay's loss, cluster), read
   * inside the transaction that would record its end; undefined while it still runs.
   */
  async endedElsewhere(turnId: string): Promise<string | undefined> {
    const row = await this.db.q
      .selectFrom('turns')
      .select(['status', 'error_code'])
      .where('id', '=', turnId)
      .executeTakeFirst()
    if (!row || row.status === 'running') return undefined
    return row.error_code ?? row.status
  }

  /**
   * Records a turn's end, in the caller's transaction: the session's row first (status, counts,
   * generation; only while its owner epoch is `session.ownerEpoch`, the row then held to the end
   * of the transaction, as a relay's loss holds it: sessions before turns), then the turn's row
   * (only while it runs). False: the owner changed, nothing was written. Throws
   * `TurnEndedElsewhere` when the turn was ended meanwhile (its relay's lease lapsed): the
   * caller's transaction must not commit.
   */
  async finishTurn(
    session: { id: string; status: SessionStatus; ownerEpoch: number },
    turn: {
      id: string
      status: TurnStatus
      response: string
      stderr: string
      errorCode: string | null
      errorMessage: string | null
      endedAt: string
      durationMs: number
    },
    change: { to: SessionStatus; cause: StatusCause; detail: string; generation: number | undefined },
  ): Promise<boolean> {
    const at = turn.endedAt
    const generation = change.generation
    const set: TurnEndRow = {
      status: turn.status,
      response: turn.response,
      stderr: turn.stderr,
      error_code: turn.errorCode,
      error_message: turn.errorMessage,
      ended_at: at,
      duration_ms: turn.durationMs,
    }
    const onPostgres = this.db.dialect === 'postgres'
    const timing = await this.changeStatus(
      session.id,
      (qc) =>
        qc
          .updateTable('sessions')
          .set((eb) => ({
            message_count: eb('message_count', '+', turn.response ? 1 : 0),
            last_active_at: at,
            updated_at: at,
            status: change.to,
            status_cause: change.cause,
            ...(generation === undefined
              ? {}
              : {
                  generation: eb
                    .case()
                    .when('generation', '<', generation)
                    .then(generation)
                    .else(eb.ref('generation'))
                    .end(),
                }),
          }))
          .where('id', '=', session.id)
          .where('owner_epoch', '=', session.ownerEpoch)
          .returning(STATUS_TIMING),
      { from: session.status, to: change.to, cause: change.cause, detail: change.detail, at },
      onPostgres ? { ended: { id: turn.id, set } } : {},
    )
    if (!timing) return false
    const ended = onPostgres
      ? timing.turnEnded === true
      : (
          await this.db.q
            .updateTable('turns')
            .set(set)
            .where('id', '=', turn.id)
            .where('status', '=', 'running')
            .executeTakeFirst()
        ).numUpdatedRows > 0n
    if (!ended) throw new TurnEndedElsewhere((await this.endedElsewhere(turn.id)) ?? 'internal')
    return true
  }

  async touch(sessionId: string, at: string): Promise<void> {
    await this.db.q.updateTable('sessions').set({ last_active_at: at }).where('id', '=', sessionId).execute()
  }

  /** The session's conversation as recorded (see TurnRecords). */
  transcript(...args: Parameters<TurnRecords['transcript']>) {
    return this.reads.transcript(...args)
  }
  turns(sessionId: string) {
    return this.reads.turns(sessionId)
  }
  turnById(turnId: string) {
    return this.reads.turnById(turnId)
  }
  messages(sessionId: string) {
    return this.reads.messages(sessionId)
  }
  events(sessionId: string) {
    return this.reads.events(sessionId)
  }
  /** See `recoverAfterRestart` (restart-recovery.ts). */
  recoverAfterRestart(at: string): Promise<{ sessions: number; turns: InterruptedTurn[] }> {
    return recoverAfterRestart(this.db, this.runtimeId, at, (row, cause, detail) =>
      this.transition(row, 'idle', cause, at, detail),
    )
  }

  /** A lease shorter than the last one brings the idle timeout earlier: the index is set again. */
  async setLease(sessionId: string, until: string, at: string): Promise<void> {
    await this.db.transaction(async () => {
      await this.db.q
        .updateTable('sessions')
        .set({ lease_until: until, last_active_at: at })
        .where('id', '=', sessionId)
        .execute()
      await refreshNextDue(this.db, sessionId)
    })
    this.timingChanged(sessionId)
  }

  async liveSessions(): Promise<LiveSession[]> {
    return (await this.db.q
      .selectFrom('sessions')
      .select(['id', 'tenant_id', 'status', 'status_cause', 'generation'])
      .where('runtime_id', '=', this.runtimeId)
      .where('status', '!=', 'deleted')
      .execute()) as LiveSession[]
  }
}

/** A session's row as a turn reads it: with its setup phase's state (null: it has none). */
export type TurnSessionRow = SessionRow & { setup_status: SetupStatus | null }

/** A session of this runtime that is not deleted, as start-up reconciles it with the pool. */
export interface LiveSession {
  id: string
  tenant_id: string
  status: SessionStatus
  status_cause: string
  generation: number
}
