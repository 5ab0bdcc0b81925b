import { iso } from '../clock.js'
import type { Db } from '../db/database.js'
import { dueOf, type SessionTiming, TIMING_COLUMNS } from './session-rows.js'

/** A session the index holds as due: its timing as read, to tell which timeout (if any) it is. */
export interface DueRow extends SessionTiming {
  id: string
  tenant_id: string
  next_due_at: string
}

/** Where a pass over due sessions goes on from (the index's order: due time, then ID). */
export interface DueCursor {
  dueAt: string
  id: string
}

/**
 * `sessions.next_due_at` (migration 25): when each session may next time out, indexed, so finding
 * what is due reads only sessions that are (never every idle one).
 *
 * The column is never later than the session's true next timeout (`dueOf`): a change that may
 * bring the timeout earlier (a new session, a status change, a new policy) sets it exactly, in the
 * transaction that makes the change; a change that only moves it later (activity, a lease) leaves
 * it as it was. A pass that reads a session whose time has not come after all sets the true
 * time (`settle`), so each such session is read once per change, not once per pass.
 */
export class DeadlineIndex {
  constructor(
    private readonly db: Db,
    /** The runtime whose sessions time out here; undefined: every session (a cluster's leader). */
    private readonly runtimeId: string | undefined,
  ) {}

  /** When the session next times out (idle timeout or max duration), in ms; undefined: never. */
  async dueAt(sessionId: string): Promise<number | undefined> {
    const row = await this.db.q
      .selectFrom('sessions')
      .select(TIMING_COLUMNS)
      .where('id', '=', sessionId)
      .executeTakeFirst()
    return row === undefined ? undefined : dueOf(row as SessionTiming)
  }

  /** The earliest time any session may time out, in ms (one row of the index); undefined: none. */
  async next(): Promise<number | undefined> {
    const row = await this.db.q
      .selectFrom('sessions')
      .select('next_due_at')
      .where('next_due_at', 'is not', null)
      .$if(this.runtimeId !== undefined, (q) => q.where('runtime_id', '=', this.runtimeId ?? ''))
      .orderBy('next_due_at')
      .limit(1)
      .executeTakeFirst()
    return row?.next_due_at ? Date.parse(row.next_due_at) : undefined
  }

  /** Up to `limit` sessions due at `nowMs`, in the index's order, after `cursor` when given. */
  async due(nowMs: number, limit: number, cursor?: DueCursor): Promise<DueRow[]> {
    return (await this.db.q
      .selectFrom('sessions')
      .select(['id', 'tenant_id', 'next_due_at', ...TIMING_COLUMNS])
      .where('next_due_at', '<=', iso(nowMs))
      .$if(this.runtimeId !== undefined, (q) => q.where('runtime_id', '=', this.runtimeId ?? ''))
      .$if(cursor !== undefined, (q) =>
        q.where((eb) =>
          eb.or([
            eb('next_due_at', '>', cursor?.dueAt ?? ''),
            eb.and([eb('next_due_at', '=', cursor?.dueAt ?? ''), eb('id', '>', cursor?.id ?? '')]),
          ]),
        ),
      )
      .orderBy('next_due_at')
      .orderBy('id')
      .limit(limit)
      .execute()) as DueRow[]
  }

  /**
   * A session read as due whose timeout is later after all (activity or a lease moved it): its
   * true next timeout is written, unless the session changed since it was read (then the change
   * wrote it, or it stays early and a later pass looks again).
   */
  async settle(row: DueRow): Promise<void> {
    const due = dueOf(row)
    await this.db.q
      .updateTable('sessions')
      .set({ next_due_at: due === undefined ? null : iso(due) })
      .where('id', '=', row.id)
      .where('next_due_at', '=', row.next_due_at)
      .where('status', '=', row.status)
      .where('last_active_at', '=', row.last_active_at)
      .where('idle_timeout_ms', '=', row.idle_timeout_ms)
      .where((eb) =>
        row.lease_until === null ? eb('lease_until', 'is', null) : eb('lease_until', '=', row.lease_until),
      )
      .where((eb) =>
        row.deadline_at === null ? eb('deadline_at', 'is', null) : eb('deadline_at', '=', row.deadline_at),
      )
      .execute()
  }
}

/** The index column for a session with this timing (a new row's, or one being changed). */
export function nextDueColumn(timing: SessionTiming): string | null {
  const due = dueOf(timing)
  return due === undefined ? null : iso(due)
}

/**
 * After an update that changed a session's timing and returned its row (the update holds the row
 * until its transaction ends): `next_due_at` is written when the session's true next timeout is
 * earlier than what the column holds (or it holds none), and cleared when the session can no
 * longer time out. A session whose turn began keeps what it held (early: its timeout only moved
 * later, and the turn's end writes it as needed), as does one whose turn ended with the column
 * still before its new idle timeout (as activity leaves it); a pass settles them. Answers the time
 * written (the reaper's timer may have to come earlier), undefined when none was.
 */
export async function keepNextDue(
  db: Db,
  sessionId: string,
  row: SessionTiming & { next_due_at: string | null },
): Promise<number | undefined> {
  const due = dueOf(row)
  const stored = row.next_due_at === null ? undefined : Date.parse(row.next_due_at)
  if (due === undefined) {
    if (stored !== undefined && row.status !== 'active') await setNextDue(db, sessionId, null)
    return undefined
  }
  if (stored !== undefined && stored <= due) return undefined
  await setNextDue(db, sessionId, iso(due))
  return due
}

async function setNextDue(db: Db, sessionId: string, nextDueAt: string | null): Promise<void> {
  await db.q.updateTable('sessions').set({ next_due_at: nextDueAt }).where('id', '=', sessionId).execute()
}

/**
 * Sets the session's `next_due_at` from its row as it is now, in one transaction with the row
 * locked (PostgreSQL): call it in the transaction that changed what may bring the timeout earlier.
 */
export async function refreshNextDue(db: Db, sessionId: string): Promise<void> {
  await db.transaction(async () => {
    let query = db.q
      .selectFrom('sessions')
      .select(['next_due_at', ...TIMING_COLUMNS])
      .where('id', '=', sessionId)
    if (db.dialect === 'postgres') query = query.forUpdate()
    const row = await query.executeTakeFirst()
    if (!row) return
    const next = nextDueColumn(row as SessionTiming)
    if (next !== row.next_due_at) await setNextDue(db, sessionId, next)
  })
}
