import { type RawBuilder, sql } from 'kysely'
import type { Db } from '../db/database.js'

/**
 * The cluster's one clock: PostgreSQL's. Leases are written and judged in the database's time, so
 * a node's clock running ahead or behind cannot make its lease look longer or shorter to the leader
 * (the node fences itself by its own monotonic clock, which only measures durations).
 *
 * `now + plusMs` as ISO-8601 text in UTC with milliseconds (what every time column holds, so text
 * order is time order).
 */
export function dbTime(plusMs: number | RawBuilder<unknown> = 0): RawBuilder<string> {
  return sql<string>`to_char((clock_timestamp() + ${plusMs}::bigint * interval '1 millisecond') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`
}

/** The database's time now (ISO-8601). */
export async function dbNow(db: Db): Promise<string> {
  const row = await sql<{ now: string }>`SELECT ${dbTime()} AS now`.execute(db.q)
  const now = row.rows[0]?.now
  if (!now) throw new Error('the database answered no time')
  return now
}
