import type { StatusCause } from '@cairn/protocol'
import type { Db } from '../db/database.js'
import type { InterruptedTurn, SessionRow } from './session-rows.js'

/**
 * After a crash: this runtime's running turns become `interrupted` and its active sessions go
 * back to `idle` (another replica's go on).
 * Returns the interrupted turns (for the check of their pre-turn snapshots).
 */
export async function recoverAfterRestart(
  db: Db,
  runtimeId: string,
  at: string,
  toIdle: (row: Pick<SessionRow, 'id' | 'status'>, cause: StatusCause, detail: string) => Promise<unknown>,
): Promise<{ sessions: number; turns: InterruptedTurn[] }> {
  return db.transaction(async () => {
    const turns = await db.q
      .selectFrom('turns as t')
      .innerJoin('sessions as s', 's.id', 't.session_id')
      .select(['t.session_id as sessionId', 's.tenant_id as tenantId', 't.seq as seq'])
      .where('t.status', '=', 'running')
      .where('s.runtime_id', '=', runtimeId)
      .execute()
    await db.q
      .updateTable('turns')
      .set({
        status: 'interrupted',
        ended_at: at,
        error_code: 'internal',
        error_message: 'the server stopped while this turn ran',
      })
      .where('status', '=', 'running')
      .where('session_id', 'in', (eb) =>
        eb.selectFrom('sessions').select('id').where('runtime_id', '=', runtimeId),
      )
      .execute()
    const active = await db.q
      .selectFrom('sessions')
      .select(['id', 'status'])
      .where('runtime_id', '=', runtimeId)
      .where('status', '=', 'active')
      .execute()
    for (const row of active)
      await toIdle(
        row as Pick<SessionRow, 'id' | 'status'>,
        'server_restart',
        'the server restarted while a turn ran',
      )
    // Holds the last process took for its operations (a restore cut by kill -9): they are over,
    // and nobody else holds this runtime's sessions (the data dir is locked to one process).
    await db.q
      .updateTable('sessions')
      .set({ held_for: null, held_by: null, held_until: null, held_swaps: null })
      .where('runtime_id', '=', runtimeId)
      .where('held_by', 'is not', null)
      .execute()
    return { sessions: active.length, turns }
  })
}
