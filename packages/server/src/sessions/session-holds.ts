import { sql } from 'kysely'
import { iso } from '../clock.js'
import { dbTime } from '../cluster/db-time.js'
import type { Db } from '../db/database.js'

/**
 * A session's hold for an exclusive operation (a restore, a move, a merge …), kept on its row so
 * every replica sees it, and the count of the workspace swaps started under holds.
 */
export class SessionHolds {
  constructor(private readonly db: Db) {}

  /**
   * Holds the session in the database for the exclusive operation `what` until `until` (every
   * replica sees it; a turn is refused while it lasts). Refused while a turn runs or another hold
   * lasts: answers what stands in the way then, undefined once held. The session row is the one
   * place a turn's beginning and a hold meet, so the two exclude each other however they race.
   */
  async hold(
    sessionId: string,
    what: { operation: string; swapsWorkspace: boolean },
    token: string,
    at: string,
    forMs: number,
  ): Promise<{ turnRunning: true } | { heldFor: string } | undefined> {
    const result = await this.db.q
      .updateTable('sessions')
      .set((eb) => ({
        held_for: what.operation,
        held_by: token,
        held_until: this.holdClock(at, forMs),
        held_swaps: what.swapsWorkspace ? 1 : 0,
        swap_count: what.swapsWorkspace ? eb('swap_count', '+', 1) : eb.ref('swap_count'),
      }))
      .where('id', '=', sessionId)
      .where('status', '!=', 'active')
      .where((eb) => eb.or([eb('held_by', 'is', null), eb('held_until', '<', this.holdClock(at))]))
      .executeTakeFirst()
    if (result.numUpdatedRows > 0n) return undefined
    const heldFor = await this.heldFor(sessionId, at)
    return heldFor ? { heldFor } : { turnRunning: true }
  }

  /** Extends the hold `token` took, if it has not lapsed (false: it lapsed, or was never taken). */
  async renewHold(sessionId: string, token: string, at: string, forMs: number): Promise<boolean> {
    const result = await this.db.q
      .updateTable('sessions')
      .set({ held_until: this.holdClock(at, forMs) })
      .where('id', '=', sessionId)
      .where('held_by', '=', token)
      .where('held_until', '>=', this.holdClock(at))
      .executeTakeFirst()
    return result.numUpdatedRows > 0n
  }

  async releaseHold(sessionId: string, token: string): Promise<void> {
    await this.db.q
      .updateTable('sessions')
      .set({ held_for: null, held_by: null, held_until: null, held_swaps: null })
      .where('id', '=', sessionId)
      .where('held_by', '=', token)
      .execute()
  }

  /** The exclusive operation holding the session at `at` (through any replica), if any. */
  async heldFor(sessionId: string, at: string): Promise<string | undefined> {
    return liveHold(await this.holdRow(sessionId, at))?.operation
  }

  /**
   * Swaps of the workspace as any replica sees them: how many have started (holds taken for one),
   * and whether one holds the session at `at`.
   */
  async swaps(
    sessionId: string,
    at: string,
  ): Promise<{ started: number; swapping: boolean; heldFor: string | undefined }> {
    const row = await this.holdRow(sessionId, at)
    const hold = liveHold(row)
    return { started: Number(row?.swap_count ?? 0), swapping: hold?.swaps === true, heldFor: hold?.operation }
  }

  private holdRow(sessionId: string, at: string) {
    return this.db.q
      .selectFrom('sessions')
      .select(['held_for', 'held_swaps', 'swap_count'])
      .select(sql<number>`CASE WHEN held_until >= ${this.holdClock(at)} THEN 1 ELSE 0 END`.as('held_live'))
      .where('id', '=', sessionId)
      .executeTakeFirst()
  }

  /**
   * Now (plus `plusMs`) as holds are judged: on PostgreSQL the database's clock, the one clock of
   * every replica (a replica's own running ahead would see live holds as lapsed); on SQLite, one
   * process, the server's (`at`).
   */
  holdClock(at: string, plusMs = 0) {
    return this.db.dialect === 'postgres' ? dbTime(plusMs) : sql<string>`${iso(Date.parse(at) + plusMs)}`
  }
}

/** The hold a session row shows, if it is live. */
function liveHold(
  row: { held_for: string | null; held_swaps: number | null; held_live: number | string } | undefined,
): { operation: string; swaps: boolean } | undefined {
  if (!row?.held_for || Number(row.held_live) !== 1) return undefined
  return { operation: row.held_for, swaps: Number(row.held_swaps) === 1 }
}
