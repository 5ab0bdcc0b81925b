import type { Approval, ApprovalStatus } from '@cairn/protocol'
import { type Selectable, sql } from 'kysely'
import type { Db } from '../db/database.js'
import type { Schema } from '../db/schema.js'

export type ApprovalRow = Selectable<Schema['approvals']>

/**
 * Approval requests and their answers, in the database (any replica answers, a restart forgets
 * nothing). Every change of state is one conditional statement: of two answers at once, one
 * changes the row and the other finds it answered.
 */
export class ApprovalStore {
  constructor(private readonly db: Db) {}

  /** Records a request and names it on its session as not yet delivered, in one transaction. */
  async insert(row: ApprovalRow): Promise<void> {
    await this.db.transaction(async () => {
      await this.db.q.insertInto('approvals').values(row).execute()
      await this.db.q
        .updateTable('sessions')
        .set({ approval_id: row.id })
        .where('id', '=', row.session_id)
        .execute()
    })
  }

  async get(tenantId: string, sessionId: string, id: string): Promise<ApprovalRow | undefined> {
    return this.db.q
      .selectFrom('approvals')
      .selectAll()
      .where('tenant_id', '=', tenantId)
      .where('session_id', '=', sessionId)
      .where('id', '=', id)
      .executeTakeFirst()
  }

  async list(tenantId: string, sessionId: string): Promise<ApprovalRow[]> {
    return this.db.q
      .selectFrom('approvals')
      .selectAll()
      .where('tenant_id', '=', tenantId)
      .where('session_id', '=', sessionId)
      .orderBy('requested_at', 'desc')
      .orderBy('id', 'desc')
      .execute()
  }

  /** Pending requests of the session past their expiry become `expired`. */
  async expireDue(sessionId: string, at: string): Promise<void> {
    await this.db.q
      .updateTable('approvals')
      .set({ status: 'expired' })
      .where('session_id', '=', sessionId)
      .where('status', '=', 'pending')
      .where('expires_at', '<=', at)
      .execute()
  }

  /** Every tenant's pending requests past their expiry become `expired`; answers how many. */
  async expireAllDue(at: string): Promise<number> {
    const result = await this.db.q
      .updateTable('approvals')
      .set({ status: 'expired' })
      .where('status', '=', 'pending')
      .where('expires_at', 'is not', null)
      .where('expires_at', '<=', at)
      .executeTakeFirst()
    return Number(result.numUpdatedRows)
  }

  /** Answers a pending, unexpired request: false if it was not (answered, expired, elsewhere). */
  async answer(
    tenantId: string,
    sessionId: string,
    id: string,
    answer: { status: ApprovalStatus; note: string | null },
    at: string,
  ): Promise<boolean> {
    const result = await this.db.q
      .updateTable('approvals')
      .set({ status: answer.status, note: answer.note, answered_at: at })
      .where('tenant_id', '=', tenantId)
      .where('session_id', '=', sessionId)
      .where('id', '=', id)
      .where('status', '=', 'pending')
      .where((eb) => eb.or([eb('expires_at', 'is', null), eb('expires_at', '>', at)]))
      .executeTakeFirst()
    return Number(result.numUpdatedRows) > 0
  }

  /**
   * The session's oldest request whose answer (or expiry) its agent has not had, claimed for the
   * turn `turnId`; the session then names the next request still open, if any.
   */
  async claimAnswered(sessionId: string, turnId: string): Promise<ApprovalRow | undefined> {
    return this.db.transaction(async () => {
      const row = await this.db.q
        .selectFrom('approvals')
        .selectAll()
        .where('session_id', '=', sessionId)
        .where('status', '!=', 'pending')
        .where('delivered_turn_id', 'is', null)
        .orderBy('requested_at')
        .orderBy('id')
        .executeTakeFirst()
      // Nothing to tell (still pending): the session keeps naming its request.
      if (!row) return undefined
      const claimed = await this.db.q
        .updateTable('approvals')
        .set({ delivered_turn_id: turnId })
        .where('id', '=', row.id)
        .where('delivered_turn_id', 'is', null)
        .executeTakeFirst()
      if (Number(claimed.numUpdatedRows) === 0) return undefined
      await this.db.q
        .updateTable('sessions')
        .set({
          approval_id: sql<
            string | null
          >`(SELECT id FROM approvals WHERE session_id = ${sessionId} AND delivered_turn_id IS NULL ORDER BY requested_at DESC, id DESC LIMIT 1)`,
        })
        .where('id', '=', sessionId)
        .execute()
      return { ...row, delivered_turn_id: turnId }
    })
  }
}

export function toApproval(row: ApprovalRow): Approval {
  return {
    id: row.id,
    sessionId: row.session_id,
    turnId: row.turn_id,
    status: row.status as ApprovalStatus,
    summary: row.summary,
    ...(row.action_json === null ? {} : { action: JSON.parse(row.action_json) as unknown }),
    note: row.note,
    snapshotId: row.snapshot_id,
    requestedAt: row.requested_at,
    expiresAt: row.expires_at,
    answeredAt: row.answered_at,
    deliveredTurnId: row.delivered_turn_id,
  }
}
