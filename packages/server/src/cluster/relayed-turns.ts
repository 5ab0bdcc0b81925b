import { newId } from '@cairn/protocol'
import { sql } from 'kysely'
import type { Db } from '../db/database.js'
import { refreshNextDue } from '../sessions/deadline-index.js'
import { HOLD_TOKEN_SEPARATOR } from '../sessions/session-deps.js'
import { dbNow, dbTime } from './db-time.js'

/** A turn ended because the replica relaying it is gone. */
export interface EndedTurn {
  sessionId: string
  turnId: string
  relayId: string
}

/** Why a relayed turn is ended by someone other than its relay. */
export interface RelayLoss {
  code: 'replica_lost'
  /** What happened to the relay ("its lease ended", "it started again"). */
  reason: string
}

/** Running turns whose relay holds no live lease (its row gone, stopped, or past `lease_until`). */
function deadRelay() {
  return sql<boolean>`NOT EXISTS (SELECT 1 FROM replicas r WHERE r.id = t.relay_id AND r.stopped_at IS NULL AND r.lease_until >= ${dbTime()})`
}

/** Whose turns `endRelayedTurns` ends. */
type Relays = { deadRelays: true; turnId?: string } | { predecessorsOf: string; self: string }

/** The running turns of `endRelayedTurns`' relays. */
function relayedTurns(db: Db, which: Relays) {
  let query = db.q
    .selectFrom('turns as t')
    .select([
      't.id as turnId',
      't.session_id as sessionId',
      't.relay_id as relayId',
      't.started_at as startedAt',
    ])
    .where('t.status', '=', 'running')
    .where('t.relay_id', 'is not', null)
  if ('deadRelays' in which) {
    query = query.where(deadRelay())
    if (which.turnId) query = query.where('t.id', '=', which.turnId)
  } else query = query.where('t.relay_id', 'in', relayIdsOf(db, which.predecessorsOf, which.self))
  return query
}

function relayIdsOf(db: Db, replicaId: string, except: string) {
  return db.q
    .selectFrom('replicas')
    .select('id')
    .where('replica_id', '=', replicaId)
    .where('id', '!=', except)
}

/**
 * Ends relayed running turns, in one transaction: each turn `failed` with the loss's code, its
 * session (if `active`) `failed` with it as cause and a session event. Locks the sessions first,
 * in ID order, as a turn's own end locks its session (`ownerEpochForUpdate`): the relay's late
 * end and this one never both land. `which`: the turns of relays whose lease is over (optionally
 * one turn), or the turns of the predecessors of `replicaId` (processes of the same data dir).
 */
export async function endRelayedTurns(db: Db, which: Relays, loss: RelayLoss): Promise<EndedTurn[]> {
  // Nearly always there is none (the leader asks every second): one read, no transaction.
  if ((await relayedTurns(db, which).execute()).length === 0) return []
  return db.transaction(async () => {
    const running = await relayedTurns(db, which).execute()
    if (running.length === 0) return []
    const sessionIds = [...new Set(running.map((t) => t.sessionId))].sort()
    const sessions = await db.q
      .selectFrom('sessions')
      .select(['id', 'status'])
      .where('id', 'in', sessionIds)
      .orderBy('id')
      .forUpdate()
      .execute()
    const statusOf = new Map(sessions.map((s) => [s.id, s.status]))
    const at = await dbNow(db)
    const ended: EndedTurn[] = []
    for (const turn of running) {
      const relayId = turn.relayId as string
      const message = `the API replica process ${relayId} that relayed this turn is gone (${loss.reason}); the turn was ended and its agent told to stop`
      const done = await db.q
        .updateTable('turns')
        .set({
          status: 'failed',
          error_code: loss.code,
          error_message: message,
          ended_at: at,
          duration_ms: Math.max(0, Date.parse(at) - Date.parse(turn.startedAt)),
        })
        .where('id', '=', turn.turnId)
        .where('status', '=', 'running')
        .where('relay_id', '=', relayId)
        .executeTakeFirst()
      if (done.numUpdatedRows === 0n) continue
      ended.push({ sessionId: turn.sessionId, turnId: turn.turnId, relayId })
      const from = statusOf.get(turn.sessionId)
      const to = from === 'active' ? 'failed' : from
      if (!from || !to) continue
      await db.q
        .updateTable('sessions')
        .set({ status: to, status_cause: loss.code, updated_at: at, last_active_at: at })
        .where('id', '=', turn.sessionId)
        .execute()
      // Its status changed: when it may next time out is read again (sessions/deadline-index.ts).
      await refreshNextDue(db, turn.sessionId)
      await db.q
        .insertInto('session_events')
        .values({
          id: newId('event'),
          session_id: turn.sessionId,
          from_status: from,
          to_status: to,
          cause: loss.code,
          detail: `${turn.turnId}: ${message}`,
          at,
        })
        .execute()
    }
    return ended
  })
}

/** The session's running turn and whether the process relaying it holds a live lease. */
export async function runningRelayedTurn(
  db: Db,
  sessionId: string,
): Promise<{ turnId: string; relayId: string | null; relayLive: boolean } | undefined> {
  const row = await db.q
    .selectFrom('turns as t')
    .select(['t.id', 't.relay_id'])
    .select(sql<boolean>`${deadRelay()}`.as('dead'))
    .where('t.session_id', '=', sessionId)
    .where('t.status', '=', 'running')
    .executeTakeFirst()
  if (!row) return undefined
  return { turnId: row.id, relayId: row.relay_id, relayLive: row.relay_id === null || !row.dead }
}

/**
 * Releases the session holds (an exclusive operation's: a snapshot, a restore, a move) taken by
 * replica processes whose lease is over, as their turns are ended: a replica killed mid-operation
 * costs its lease, not the hold's own 60 s. How many it released.
 */
export async function releaseDeadRelayHolds(db: Db): Promise<number> {
  const result = await deadRelayHolds(db).executeTakeFirst()
  return Number(result.numUpdatedRows)
}

/**
 * The update of `releaseDeadRelayHolds`: it runs every second on the leader, so it finds the held
 * sessions through their index (`sessions_held`, the held ones only), not by reading every session.
 */
export function deadRelayHolds(db: Db) {
  return db.q
    .updateTable('sessions as s')
    .set({ held_for: null, held_by: null, held_until: null, held_swaps: null })
    .where('s.held_by', 'is not', null)
    .where('s.held_by', 'like', `rpl_%${HOLD_TOKEN_SEPARATOR}%`)
    .where(
      sql<boolean>`NOT EXISTS (SELECT 1 FROM replicas r WHERE r.id = split_part(s.held_by, ${HOLD_TOKEN_SEPARATOR}, 1) AND r.stopped_at IS NULL AND r.lease_until >= ${dbTime()})`,
    )
}

/** Forgets replica processes whose lease ended `keepMs` ago and that relay no running turn. */
export async function pruneReplicas(db: Db, keepMs: number): Promise<void> {
  await db.q
    .deleteFrom('replicas')
    .where('lease_until', '<', dbTime(-keepMs))
    .where(({ not, exists, selectFrom }) =>
      not(
        exists(
          selectFrom('turns')
            .select('turns.id')
            .whereRef('turns.relay_id', '=', 'replicas.id')
            .where('turns.status', '=', 'running'),
        ),
      ),
    )
    .execute()
}
