import { newId } from '@cairn/protocol'
import pino from 'pino'
import type { Db } from '../src/db/database.js'

/** Test support for the cluster's tests: a quiet logger and session rows owned by a node. */
export const quietLogger = pino({ level: 'silent' })

/** Polls `check` until it answers something other than undefined/false, or fails after `timeoutMs`. */
export async function eventually<T>(
  check: () => Promise<T | undefined | false>,
  timeoutMs = 10_000,
): Promise<T> {
  const until = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value !== undefined && value !== false) return value
    if (Date.now() > until) throw new Error(`not within ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
}

/** A tenant, an agent and a revision to hang sessions on. */
async function seedAgent(db: Db): Promise<{ tenantId: string; agentId: string; revisionId: string }> {
  const at = new Date().toISOString()
  const tenantId = newId('tenant')
  const agentId = newId('agent')
  const revisionId = newId('revision')
  await db.q.insertInto('tenants').values({ id: tenantId, name: 't', created_at: at }).execute()
  await db.q
    .insertInto('agents')
    .values({
      id: agentId,
      tenant_id: tenantId,
      name: 'a',
      current_revision_id: revisionId,
      created_at: at,
      updated_at: at,
    })
    .execute()
  await db.q
    .insertInto('revisions')
    .values({
      id: revisionId,
      agent_id: agentId,
      tenant_id: tenantId,
      status: 'ready',
      content_hash: 'h',
      manifest_json: '{}',
      file_count: 0,
      size_bytes: 0,
      error: null,
      created_at: at,
    })
    .execute()
  return { tenantId, agentId, revisionId }
}

/**
 * Sessions owned by `nodeId` in the given statuses; an `active` one has a running turn (as a
 * turn in flight leaves them). Returns their IDs and the running turns'.
 */
export async function seedSessions(
  db: Db,
  nodeId: string,
  statuses: ('idle' | 'active' | 'completed' | 'deleted')[],
): Promise<{ sessions: string[]; turns: string[] }> {
  const { tenantId, agentId, revisionId } = await seedAgent(db)
  const at = new Date().toISOString()
  const sessions: string[] = []
  const turns: string[] = []
  for (const status of statuses) {
    const id = newId('session')
    sessions.push(id)
    await db.q
      .insertInto('sessions')
      .values({
        id,
        tenant_id: tenantId,
        agent_id: agentId,
        revision_id: revisionId,
        title: null,
        status,
        status_cause: status === 'active' ? 'turn_started' : 'created',
        idle_timeout_ms: 60_000,
        keep_warm_ms: 1000,
        created_at: at,
        updated_at: at,
        last_active_at: at,
        parent_session_id: null,
        forked_from_snapshot_id: null,
        lease_until: null,
        network_json: null,
        max_turns: null,
        max_duration_ms: null,
        deadline_at: null,
        runtime_id: nodeId,
        pause: null,
      })
      .execute()
    if (status === 'active') {
      const turnId = newId('turn')
      turns.push(turnId)
      await db.q
        .insertInto('turns')
        .values({
          id: turnId,
          session_id: id,
          seq: 1,
          status: 'running',
          prompt: 'hello',
          sandbox_id: null,
          error_code: null,
          error_message: null,
          started_at: at,
          ended_at: null,
          duration_ms: null,
        })
        .execute()
    }
  }
  return { sessions, turns }
}
