import { newId, type SessionStatus, type StatusCause, type TurnStatus } from '@cairn/protocol'
import { type QueryCreator, type Selection, sql, type UpdateQueryBuilder } from 'kysely'
import type { Db } from '../db/database.js'
import type { Schema } from '../db/schema.js'
import { keepNextDue } from './deadline-index.js'
import { TIMING_COLUMNS } from './session-rows.js'

/**
 * The writes of a session's status change: the update of its row, the transition's event and,
 * for a turn, the turn's row, in as few statements as the database allows (one on PostgreSQL).
 */

/** A status change: from what to what, why, when. */
export interface StatusChange {
  from: string
  to: SessionStatus
  cause: StatusCause
  detail?: string | undefined
  at: string
}

/**
 * PostgreSQL, in the same statement if the session's row was changed: a new turn's row written,
 * or a running turn's ended (`turnEnded` says whether it was still running).
 */
export interface TurnWrites {
  begun?: Record<string, string | number | null>
  ended?: { id: string; set: TurnEndRow }
}

/**
 * The session's timing after the change (and whether the turn it ended was still running; its
 * owner epoch, when the update returns it: a turn's begin, the epoch the turn began under).
 */
export type ChangedTiming = ReturnedTiming & { turnEnded?: boolean; owner_epoch?: number | string }

/**
 * Changes a session's status by `update` (which returns its timing) and records the transition's
 * event: on PostgreSQL in one statement (the event, and `turn`, written from the updated row), on
 * SQLite in two. Then the deadline index is kept (written only if the timeout came earlier, and
 * `earlier` told). Undefined: `update` changed no row, and nothing was written.
 */
export async function changeStatus(
  db: Db,
  sessionId: string,
  update: (qc: QueryCreator<Schema>) => StatusUpdate,
  change: StatusChange,
  /**
   * PostgreSQL, in the same statement if the session's row was changed: a new turn's row
   * written, or a running turn's ended (`turnEnded` says whether it was still running).
   */
  turn: TurnWrites,
  /** Told the session's next timeout when it came earlier (written, once committed). */
  earlier: (dueMs: number) => void,
): Promise<ChangedTiming | undefined> {
  const event = {
    id: newId('event'),
    session_id: sessionId,
    from_status: change.from,
    to_status: change.to,
    cause: change.cause,
    detail: change.detail ?? null,
    at: change.at,
  }
  let timing: ChangedTiming | undefined
  if (db.dialect === 'postgres') {
    const base = db.q
      .with('changed', update)
      .with('event', (qc) => insertFromChanged(qc, 'session_events', event))
    const { begun, ended } = turn
    let query = base
    if (begun)
      query = base.with('turn', (qc) => insertFromChanged(qc, 'turns', begun)) as unknown as typeof base
    if (ended) {
      const row = await base
        .with('ended', (qc) =>
          qc
            .updateTable('turns')
            .set(ended.set)
            .where('id', '=', ended.id)
            .where('status', '=', 'running')
            .where(sql<boolean>`exists (select 1 from changed)`)
            .returning('id'),
        )
        .selectFrom('changed')
        .selectAll()
        .select(sql<number>`(select count(*) from ended)`.as('turns_ended'))
        .executeTakeFirst()
      timing = row && { ...row, turnEnded: Number(row.turns_ended) > 0 }
    } else timing = await query.selectFrom('changed').selectAll().executeTakeFirst()
  } else {
    timing = await update(db.q).executeTakeFirst()
    if (timing) await db.q.insertInto('session_events').values(event).execute()
  }
  if (!timing) return undefined
  const dueMs = await keepNextDue(db, sessionId, timing as StatusTiming)
  if (dueMs !== undefined) earlier(dueMs)
  return timing
}

/**
 * An insert into `table` of `values` for each row of the CTE `changed` (PostgreSQL): written
 * only if the update it names changed a row. Numbers are cast (a parameter in a select list is
 * text to PostgreSQL).
 */
function insertFromChanged<DB extends Schema>(
  qc: QueryCreator<DB>,
  table: 'turns' | 'session_events',
  values: Record<string, string | number | null>,
) {
  const selections = Object.entries(values).map(([column, value]) =>
    typeof value === 'number'
      ? sql`cast(${value} as bigint) as ${sql.ref(column)}`
      : sql`${value} as ${sql.ref(column)}`,
  )
  return qc
    .insertInto(table)
    .columns(Object.keys(values) as never)
    .expression(sql`select ${sql.join(selections)} from changed`)
}

/** A turn someone else ended while it ran (`code`: the row's error code or status). */
export class TurnEndedElsewhere extends Error {
  constructor(readonly code: string) {
    super(`the turn was ended elsewhere (${code})`)
  }
}

/** What an update that changes a session's status returns: its timing, for the deadline index. */
export const STATUS_TIMING = ['next_due_at', ...TIMING_COLUMNS] as const

type StatusTiming = Parameters<typeof keepNextDue>[2]
/** What a turn's end writes to its row. */
export interface TurnEndRow {
  status: TurnStatus
  response: string
  stderr: string
  error_code: string | null
  error_message: string | null
  ended_at: string
  duration_ms: number
}
export type ReturnedTiming = Omit<StatusTiming, 'status'> & { status: string }
export type StatusUpdate = UpdateQueryBuilder<
  Schema,
  'sessions',
  'sessions',
  Selection<Schema, 'sessions', (typeof STATUS_TIMING)[number]>
>
