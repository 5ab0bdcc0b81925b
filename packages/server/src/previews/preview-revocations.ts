import type { Db } from '../db/database.js'

/** The row that stands for every port of a session (real ports are 1–65535). */
const ALL_PORTS = 0

/**
 * Revocation of signed preview URLs, kept in SQLite so it outlives a restart. Each session port has
 * an epoch; a URL is signed with the epoch current when it was issued and is good only while that
 * epoch is still current. Revoking a port moves its epoch past the current one; revoking a session
 * (its end) moves the session-wide row past every port's, so the current epoch of a port is the
 * larger of its own row and the session's, and it only ever grows.
 */
export class PreviewRevocations {
  constructor(private readonly db: Db) {}

  async current(sessionId: string, port: number): Promise<number> {
    const row = await this.db.q
      .selectFrom('preview_url_epochs')
      .select((eb) => eb.fn.max('epoch').as('epoch'))
      .where('session_id', '=', sessionId)
      .where('port', 'in', [port, ALL_PORTS])
      .executeTakeFirst()
    return Number(row?.epoch ?? 0)
  }

  private async set(sessionId: string, port: number, epoch: number): Promise<void> {
    await this.db.q
      .insertInto('preview_url_epochs')
      .values({ session_id: sessionId, port, epoch })
      .onConflict((oc) => oc.columns(['session_id', 'port']).doUpdateSet({ epoch }))
      .execute()
  }

  async revokePort(sessionId: string, port: number): Promise<void> {
    await this.db.transaction(async () => {
      await this.set(sessionId, port, (await this.current(sessionId, port)) + 1)
    })
  }

  async revokeSession(sessionId: string): Promise<void> {
    await this.db.transaction(async () => {
      const row = await this.db.q
        .selectFrom('preview_url_epochs')
        .select((eb) => eb.fn.max('epoch').as('epoch'))
        .where('session_id', '=', sessionId)
        .executeTakeFirst()
      await this.set(sessionId, ALL_PORTS, Number(row?.epoch ?? 0) + 1)
    })
  }
}
