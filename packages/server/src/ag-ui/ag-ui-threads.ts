import { CairnProblem, isId } from '@cairn/protocol'
import type { Logger } from 'pino'
import type { Db } from '../db/database.js'
import type { SessionService } from '../sessions/session-service.js'

/**
 * AG-UI threads as Cairn sessions. A thread named by a session ID is that session (one of the
 * agent's, in the key's tenant); any other name is the tenant's own name for one session of the
 * agent, made at the thread's first run and found again at each next one (`ag_ui_threads`).
 */
export class AgUiThreads {
  constructor(private readonly deps: { db: Db; sessions: SessionService; logger: Logger }) {}

  async sessionFor(tenantId: string, agent: { id: string; name: string }, threadId: string): Promise<string> {
    const { sessions } = this.deps
    if (isId('session', threadId)) {
      const info = await sessions.get(tenantId, threadId)
      if (info.agentId !== agent.id)
        throw new CairnProblem(
          'validation_failed',
          `thread ${threadId} is a session of agent ${info.agentName}, not of ${agent.name}`,
        )
      return info.id
    }
    const known = await this.find(tenantId, agent.id, threadId)
    if (known) return known
    const created = await sessions.create(tenantId, { agent: agent.id })
    const inserted = await this.deps.db.q
      .insertInto('ag_ui_threads')
      .values({
        tenant_id: tenantId,
        agent_id: agent.id,
        thread_id: threadId,
        session_id: created.id,
        created_at: created.createdAt,
      })
      .onConflict((conflict) => conflict.columns(['tenant_id', 'agent_id', 'thread_id']).doNothing())
      .returning('session_id')
      .executeTakeFirst()
    if (inserted) return created.id
    // Another run of the thread made its session first: that one is the thread's, ours goes.
    await sessions.delete(tenantId, created.id).catch((error: unknown) => {
      this.deps.logger.warn({ err: error, sessionId: created.id }, 'ag-ui: a spare session was not deleted')
    })
    const winner = await this.find(tenantId, agent.id, threadId)
    if (!winner)
      throw new CairnProblem('conflict', `thread ${threadId} could not be started: send the run again`)
    return winner
  }

  private async find(tenantId: string, agentId: string, threadId: string): Promise<string | undefined> {
    const row = await this.deps.db.q
      .selectFrom('ag_ui_threads')
      .select('session_id')
      .where('tenant_id', '=', tenantId)
      .where('agent_id', '=', agentId)
      .where('thread_id', '=', threadId)
      .executeTakeFirst()
    return row?.session_id
  }
}
