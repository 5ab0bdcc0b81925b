import {
  newId,
  type SessionPolicy,
  type SessionStatus,
  type SetupStatus,
  type StatusCause,
} from '@cairn/protocol'
import { sql } from 'kysely'
import type { Db } from '../db/database.js'
import type { ArgsOf } from '../db/query-shapes.js'
import { standingFor } from '../snapshots/snapshot-store.js'
import { DeadlineIndex, nextDueColumn, refreshNextDue } from './deadline-index.js'
import { NetworkLog } from './network-log.js'
import { recoverAfterRestart } from './restart-recovery.js'
import { SessionHolds } from './session-holds.js'
import type { InterruptedTurn, ListFilter, NewSession, SessionRow } from './session-rows.js'
import { SessionTurnWrites } from './session-turn-writes.js'
import {
  type ChangedTiming,
  changeStatus,
  STATUS_TIMING,
  type StatusChange,
  type StatusUpdateOf,
  type TurnWrites,
} from './status-writes.js'
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
  private readonly turnWrites: SessionTurnWrites
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
    this.turnWrites = new SessionTurnWrites(db, this.holds, (id, update, change, turn) =>
      this.changeStatus(id, update, change, turn),
    )
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
  private changeStatus<A extends ArgsOf<A>>(
    sessionId: string,
    update: StatusUpdateOf<A>,
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
    const { rows } = await this.db.shaped('session for a turn', { tenantId, id }, (q, a) =>
      q
        .selectFrom('sessions as s')
        .innerJoin('agents as a', 'a.id', 's.agent_id')
        .selectAll('s')
        .select('a.name as agent_name')
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
        .where('s.tenant_id', '=', a.tenantId)
        .where('s.id', '=', a.id),
    )
    return rows[0] as TurnSessionRow | undefined
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
        {
          key: 'transition',
          args: { to, cause, at, id: row.id },
          build: (qc, a) =>
            qc
              .updateTable('sessions')
              .set({ status: a.to, status_cause: a.cause, updated_at: a.at })
              .where('id', '=', a.id)
              .returning(STATUS_TIMING),
        },
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

  /** A turn's begin and end (see SessionTurnWrites). */
  startTurn(...args: Parameters<SessionTurnWrites['startTurn']>) {
    return this.turnWrites.startTurn(...args)
  }
  setTurnSandbox(...args: Parameters<SessionTurnWrites['setTurnSandbox']>) {
    return this.turnWrites.setTurnSandbox(...args)
  }
  ownerEpochForUpdate(sessionId: string) {
    return this.turnWrites.ownerEpochForUpdate(sessionId)
  }
  endedElsewhere(turnId: string) {
    return this.turnWrites.endedElsewhere(turnId)
  }
  finishTurn(...args: Parameters<SessionTurnWrites['finishTurn']>) {
    return this.turnWrites.finishTurn(...args)
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
