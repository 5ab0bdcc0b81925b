import { CairnProblem, type SessionStatus, type StatusCause, type TurnStatus } from '@cairn/protocol'
import { sql } from 'kysely'
import { iso } from '../clock.js'
import { type Db, isUniqueViolation } from '../db/database.js'
import type { ArgsOf } from '../db/query-shapes.js'
import type { SessionHolds } from './session-holds.js'
import {
  type ChangedTiming,
  STATUS_TIMING,
  type StatusChange,
  type StatusUpdateOf,
  TurnEndedElsewhere,
  type TurnEndRow,
  type TurnWrites,
} from './status-writes.js'
import { MOVE_OPERATION } from './turn-locks.js'

/** `SessionStore`'s status change (status-writes.ts' `changeStatus`, the reaper told). */
export type ChangeStatus = <A extends ArgsOf<A>>(
  sessionId: string,
  update: StatusUpdateOf<A>,
  change: StatusChange,
  turn?: TurnWrites,
) => Promise<ChangedTiming | undefined>

/**
 * A turn's rows as it begins and ends, each with the session's status change in the same write:
 * one running turn per session (the database refuses a second, and a held session begins none),
 * and an end recorded only while the session's owner is unchanged and the turn still runs.
 */
export class SessionTurnWrites {
  constructor(
    private readonly db: Db,
    private readonly holds: SessionHolds,
    private readonly changeStatus: ChangeStatus,
  ) {}

  /**
   * Records a new running turn and the session's `idle → active` transition (one update of its
   * row). The database holds at most one running turn per session (a partial unique index): a
   * second one, from this process or another replica, is refused with `session_busy` and nothing
   * of it is recorded. `sandboxId`: the warm sandbox the turn is expected to run in, if known.
   * Resolves to the session's owner epoch the turn began under (read in the same statement).
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
  }): Promise<{ ownerEpoch: number }> {
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
    let ownerEpoch = 0
    // SQLite compares hold times as text: the turn's time, as `holdClock` writes it.
    const holdBefore = onPostgres ? this.holds.holdClock(at) : undefined
    const begin = async () => {
      if (!onPostgres) await this.db.shaped('turn begun', row, (q, a) => q.insertInto('turns').values(a))
      const timing = await this.changeStatus(
        sessionId,
        {
          key: 'turn begun',
          args: { title: turn.title, at, id: sessionId, heldBefore: iso(Date.parse(at)) },
          build: (qc, a) =>
            qc
              .updateTable('sessions')
              .set((eb) => ({
                turn_count: eb('turn_count', '+', 1),
                message_count: eb('message_count', '+', 1),
                title: eb.fn.coalesce('title', eb.val(a.title)),
                last_active_at: a.at,
                updated_at: a.at,
                status: 'active',
                status_cause: 'turn_started',
              }))
              .where('id', '=', a.id)
              .where((eb) =>
                eb.or([
                  eb('held_by', 'is', null),
                  eb('held_until', '<', holdBefore ?? sql<string>`${a.heldBefore}`),
                ]),
              )
              .returning([...STATUS_TIMING, 'owner_epoch']),
        },
        { from: 'idle', to: 'active', cause: 'turn_started', detail: turn.turnId, at },
        onPostgres ? { begun: row } : {},
      )
      ownerEpoch = Number(timing?.owner_epoch ?? 0)
      if (!timing) {
        // An exclusive operation holds the session (through any replica): the turn is not begun.
        const held = await this.holds.heldFor(sessionId, at)
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
    return { ownerEpoch }
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
    const advances = generation !== undefined
    const timing = await this.changeStatus(
      session.id,
      {
        key: advances ? 'turn ended, generation advanced' : 'turn ended',
        args: {
          replied: turn.response ? 1 : 0,
          at,
          to: change.to,
          cause: change.cause,
          id: session.id,
          ownerEpoch: session.ownerEpoch,
          ...(advances ? { generation } : {}),
        },
        build: (qc, a) =>
          qc
            .updateTable('sessions')
            .set((eb) => ({
              message_count: eb('message_count', '+', a.replied),
              last_active_at: a.at,
              updated_at: a.at,
              status: a.to,
              status_cause: a.cause,
              ...(a.generation === undefined
                ? {}
                : {
                    generation: eb
                      .case()
                      .when('generation', '<', a.generation)
                      // A value, not a number: Kysely writes a number given to `then` into the text.
                      .then(eb.val(a.generation))
                      .else(eb.ref('generation'))
                      .end(),
                  }),
            }))
            .where('id', '=', a.id)
            .where('owner_epoch', '=', a.ownerEpoch)
            .returning(STATUS_TIMING),
      },
      { from: session.status, to: change.to, cause: change.cause, detail: change.detail, at },
      onPostgres ? { ended: { id: turn.id, set } } : {},
    )
    if (!timing) return false
    const ended = onPostgres
      ? timing.turnEnded === true
      : (
          await this.db.shaped('turn ended', { ...set, turnId: turn.id }, (q, { turnId, ...ended }) =>
            q.updateTable('turns').set(ended).where('id', '=', turnId).where('status', '=', 'running'),
          )
        ).changed > 0n
    if (!ended) throw new TurnEndedElsewhere((await this.endedElsewhere(turn.id)) ?? 'internal')
    return true
  }
}
