import type { NetworkEventInfo } from '@cairn/protocol'
import type { NetworkEvent } from '@cairn/runtime/port'
import type { Db } from '../db/database.js'

/** A session's network log: the egress proxy's decisions, newest kept. */
export class NetworkLog {
  constructor(private readonly db: Db) {}

  async record(sessionId: string, event: NetworkEvent): Promise<void> {
    await this.db.q
      .insertInto('network_events')
      .values({
        session_id: sessionId,
        at: event.at,
        host: event.host,
        port: event.port,
        method: event.method,
        allowed: event.allowed ? 1 : 0,
        reason: event.reason,
        address: event.address ?? null,
      })
      .execute()
  }

  async recent(sessionId: string, limit: number): Promise<NetworkEventInfo[]> {
    const rows = await this.db.q
      .selectFrom('network_events')
      .select(['at', 'host', 'port', 'method', 'allowed', 'reason', 'address'])
      .where('session_id', '=', sessionId)
      .orderBy('id', 'desc')
      .limit(limit)
      .execute()
    return rows.reverse().map((row) => ({ ...row, allowed: row.allowed === 1 }))
  }
}
