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
  private readonly s

  constructor(private readonly db: Db) {
    this.s = {
      current: db.prepare<[string, number, number], { epoch: number | null }>(
        'SELECT MAX(epoch) AS epoch FROM preview_url_epochs WHERE session_id = ? AND port IN (?, ?)',
      ),
      highest: db.prepare<[string], { epoch: number | null }>(
        'SELECT MAX(epoch) AS epoch FROM preview_url_epochs WHERE session_id = ?',
      ),
      set: db.prepare<[string, number, number]>(
        `INSERT INTO preview_url_epochs (session_id, port, epoch) VALUES (?, ?, ?)
         ON CONFLICT(session_id, port) DO UPDATE SET epoch = excluded.epoch`,
      ),
    }
  }

  /** The epoch a URL for this port is signed with now; 0 until something was revoked. */
  current(sessionId: string, port: number): number {
    return this.s.current.get(sessionId, port, ALL_PORTS)?.epoch ?? 0
  }

  /** Every URL issued so far for this port stops working. */
  revokePort(sessionId: string, port: number): void {
    this.db.transaction(() => {
      this.s.set.run(sessionId, port, this.current(sessionId, port) + 1)
    })()
  }

  /** Every URL issued so far for any port of the session stops working. */
  revokeSession(sessionId: string): void {
    this.db.transaction(() => {
      this.s.set.run(sessionId, ALL_PORTS, (this.s.highest.get(sessionId)?.epoch ?? 0) + 1)
    })()
  }
}
