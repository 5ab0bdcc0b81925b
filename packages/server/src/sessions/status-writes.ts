import { newId, type SessionStatus, type StatusCause, type TurnStatus } from '@cairn/protocol'
import { type QueryCreator, type Selection, sql, type UpdateQueryBuilder } from 'kysely'
import type { Db } from '../db/database.js'
import type { ArgsOf, ShapeArgs } from '../db/query-shapes.js'
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
 * The update of a session's row that changes its status (returning its timing), as a shaped
 * statement (db/query-shapes.ts): `build` makes it from `args`, the same text for every value of
 * them; `key` names what else shapes it.
 */
export interface StatusUpdateOf<A extends ArgsOf<A>> {
  key: string
  args: A
  build: (qc: QueryCreator<Schema>, args: A) => StatusUpdate
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
 * SQLite in two. Each is compiled once per shape: a turn's start and end send them every turn.
 * Then the deadline index is kept (written only if the timeout came earlier, and `earlier` told).
 * Undefined: `update` changed no row, and nothing was written.
 */
export async function changeStatus<A extends ArgsOf<A>>(
  db: Db,
  sessionId: string,
  update: StatusUpdateOf<A>,
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
    const { begun, ended } = turn
    const args = {
      ...prefixed('u', update.args),
      ...prefixed('e', event),
      ...prefixed('b', begun ?? {}),
      ...(ended ? { ...prefixed('d', ended.set), endedTurnId: ended.id } : {}),
    }
    const key = `status change, ${update.key}${begun ? ', a turn begun' : ''}${ended ? ', a turn ended' : ''}`
    const { rows } = await db.shaped(key, args, (q, a) => {
      const base = q
        .with('changed', (qc) => update.build(qc, unprefixed('u', a) as unknown as A))
        .with('event', (qc) => insertFromChanged(qc, 'session_events', unprefixed('e', a)))
      let query = base
      if (begun)
        query = base.with('turn', (qc) =>
          insertFromChanged(qc, 'turns', unprefixed('b', a)),
        ) as unknown as typeof base
      if (!ended) return query.selectFrom('changed').selectAll()
      return base
        .with('ended', (qc) =>
          qc
            .updateTable('turns')
            .set(unprefixed('d', a) as unknown as TurnEndRow)
            .where('id', '=', a.endedTurnId as string)
            .where('status', '=', 'running')
            .where(sql<boolean>`exists (select 1 from changed)`)
            .returning('id'),
        )
        .selectFrom('changed')
        .selectAll()
        .select(sql<number>`(select count(*) from ended)`.as('turns_ended'))
    })
    const row = rows[0] as (ReturnedTiming & { turns_ended?: number | string }) | undefined
    if (row && ended) {
      const { turns_ended, ...rest } = row
      timing = { ...rest, turnEnded: Number(turns_ended) > 0 }
    } else timing = row
  } else {
    const { rows } = await db.shaped(`status change, ${update.key}`, update.args, (q, a) =>
      update.build(q, a),
    )
    timing = rows[0] as ChangedTiming | undefined
    if (timing)
      await db.shaped('session event', event, (q, a) => q.insertInto('session_events').values(a as never))
  }
  if (!timing) return undefined
  const dueMs = await keepNextDue(db, sessionId, timing as StatusTiming)
  if (dueMs !== undefined) earlier(dueMs)
  return timing
}

/** `values` with each name prefixed (`p_name`), to stand beside other statements' in one shape. */
function prefixed<V extends ArgsOf<V>>(prefix: string, values: V): ShapeArgs {
  const out: Record<string, string | number | null> = {}
  for (const [name, value] of Object.entries(values as ShapeArgs)) out[`${prefix}_${name}`] = value
  return out
}

/** The arguments of `args` prefixed `prefix_`, without it. */
function unprefixed(prefix: string, args: ShapeArgs): Record<string, string | number | null> {
  const out: Record<string, string | number | null> = {}
  for (const [name, value] of Object.entries(args))
    if (name.startsWith(`${prefix}_`)) out[name.slice(prefix.length + 1)] = value
  return out
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
