import { newId } from '@cairn/protocol'
import type { Db } from '../db/database.js'
import { refreshNextDue } from '../sessions/deadline-index.js'
import type { ClusterHint } from './cluster-hints.js'
import { dbNow } from './db-time.js'
import { LEASED_STATES } from './node-store.js'

export interface NodeLost {
  nodeId: string
  epoch: number
  /** Sessions whose owner epoch went up. */
  sessions: number
  /** Running turns ended `failed` with `node_lost`. */
  turns: { sessionId: string; turnId: string }[]
}

/**
 * Declares a node lost, in one transaction: the node's row `lost`; each of its sessions' owner
 * epoch one more (a write the lost incarnation still makes carries the old epoch and changes
 * nothing), its status cause `node_lost` (active ones go idle); its running turns end `failed`
 * with `node_lost`. Nothing happens if that incarnation no longer holds a lease (it stopped, or
 * registered again meanwhile).
 */
export async function declareNodeLost(
  db: Db,
  nodeId: string,
  epoch: number,
  reason: string,
  publish?: (hint: ClusterHint) => Promise<void>,
): Promise<NodeLost | undefined> {
  return db.transaction(async () => {
    const at = await dbNow(db)
    const node = await db.q
      .updateTable('nodes')
      .set({ state: 'lost', lost_at: at })
      .where('id', '=', nodeId)
      .where('epoch', '=', epoch)
      .where('state', 'in', LEASED_STATES)
      .returning('id')
      .executeTakeFirst()
    if (!node) return undefined
    // Locked in a fixed order (by ID), as the turn writers lock them, so this never deadlocks.
    const sessions = await db.q
      .selectFrom('sessions')
      .select(['id', 'status'])
      .where('runtime_id', '=', nodeId)
      .where('status', '!=', 'deleted')
      .orderBy('id')
      .forUpdate()
      .execute()
    const running = await db.q
      .selectFrom('turns as t')
      .innerJoin('sessions as s', 's.id', 't.session_id')
      .select(['t.id as turnId', 't.session_id as sessionId', 't.started_at as startedAt'])
      .where('s.runtime_id', '=', nodeId)
      .where('t.status', '=', 'running')
      .execute()
    const message = `the session's node ${nodeId} was declared lost (${reason}) while this turn ran`
    for (const turn of running)
      await db.q
        .updateTable('turns')
        .set({
          status: 'failed',
          error_code: 'node_lost',
          error_message: message,
          ended_at: at,
          duration_ms: Math.max(0, Date.parse(at) - Date.parse(turn.startedAt)),
        })
        .where('id', '=', turn.turnId)
        .where('status', '=', 'running')
        .execute()
    if (sessions.length > 0) {
      await db.q
        .updateTable('sessions')
        .set((eb) => ({
          owner_epoch: eb('owner_epoch', '+', 1),
          status: eb.case().when('status', '=', 'active').then('idle').else(eb.ref('status')).end(),
          status_cause: 'node_lost',
          updated_at: at,
        }))
        .where('runtime_id', '=', nodeId)
        .where('status', '!=', 'deleted')
        .execute()
      // An active session became idle: its idle timeout counts from now on.
      for (const s of sessions) if (s.status === 'active') await refreshNextDue(db, s.id)
      await db.q
        .insertInto('session_events')
        .values(
          sessions.map((s) => ({
            id: newId('event'),
            session_id: s.id,
            from_status: s.status,
            to_status: s.status === 'active' ? 'idle' : s.status,
            cause: 'node_lost',
            detail: `node ${nodeId} (epoch ${epoch}): ${reason}`,
            at,
          })),
        )
        .execute()
    }
    const turns = running.map(({ sessionId, turnId }) => ({ sessionId, turnId }))
    await publish?.({ kind: 'node.lost', nodeId, epoch, turns })
    return { nodeId, epoch, sessions: sessions.length, turns }
  })
}
