import {
  type AnswerApprovalBody,
  type Approval,
  type ApprovalAnswer,
  approvalPrompt,
  CairnProblem,
} from '@cairn/protocol'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { ApprovalAsked, SessionObserver } from '../sessions/session-observer.js'
import type { SessionService } from '../sessions/session-service.js'
import type { SessionRow } from '../sessions/session-store.js'
import { type ApprovalStore, toApproval } from './approval-store.js'

export interface ApprovalServiceDeps {
  store: ApprovalStore
  sessions: SessionService
  /** Takes the review snapshot of the session's workspace (the sandbox frozen); answers its ID. */
  reviewSnapshot(row: SessionRow, seq: number, approvalId: string): Promise<string>
  clock: Clock
  logger: Logger
}

/**
 * Human review (docs/approvals.md). An agent's request is recorded when its turn completes, with
 * a review snapshot; an answer is stored first, then carried to the agent by a turn begun at once
 * (or, if the session is busy, by its next turn): whichever turn comes first after the answer
 * claims it, on any replica, after any restart.
 */
export class ApprovalService implements SessionObserver {
  constructor(private readonly deps: ApprovalServiceDeps) {}

  private now(): string {
    return iso(this.deps.clock.now())
  }

  async approvalRequested(row: SessionRow, asked: ApprovalAsked): Promise<void> {
    const snapshotId = await this.deps.reviewSnapshot(row, asked.seq, asked.id).catch((error: unknown) => {
      this.deps.logger.warn({ err: error, session: row.id }, 'the review snapshot failed')
      return null
    })
    const nowMs = this.deps.clock.now()
    const timeoutMs = row.approval_timeout_ms
    await this.deps.store.insert({
      id: asked.id,
      tenant_id: row.tenant_id,
      session_id: row.id,
      turn_id: asked.turnId,
      status: 'pending',
      summary: asked.summary,
      action_json: asked.action === undefined ? null : JSON.stringify(asked.action),
      note: null,
      snapshot_id: snapshotId,
      requested_at: iso(nowMs),
      expires_at: timeoutMs === null || timeoutMs === undefined ? null : iso(nowMs + timeoutMs),
      answered_at: null,
      delivered_turn_id: null,
    })
  }

  async approvalFor(row: SessionRow, turnId: string): Promise<ApprovalAnswer | undefined> {
    await this.deps.store.expireDue(row.id, this.now())
    const claimed = await this.deps.store.claimAnswered(row.id, turnId)
    if (!claimed) return undefined
    const decision =
      claimed.status === 'approved' ? 'approve' : claimed.status === 'denied' ? 'deny' : 'expired'
    return { id: claimed.id, decision, note: claimed.note }
  }

  /**
   * Expires every request past its `expiresAt` (the housekeeping pass): an expiry is then seen, and
   * its `approval.expired` webhook sent, within one pass even if nobody reads the session.
   */
  async expireDue(): Promise<number> {
    return this.deps.store.expireAllDue(this.now())
  }

  async list(tenantId: string, sessionId: string): Promise<Approval[]> {
    const session = await this.deps.sessions.get(tenantId, sessionId)
    await this.deps.store.expireDue(session.id, this.now())
    return (await this.deps.store.list(tenantId, session.id)).map(toApproval)
  }

  async get(tenantId: string, sessionId: string, id: string): Promise<Approval> {
    const session = await this.deps.sessions.get(tenantId, sessionId)
    await this.deps.store.expireDue(session.id, this.now())
    return toApproval(await this.require(tenantId, session.id, id))
  }

  /**
   * Answers a pending request (the first answer stands), then begins the turn that tells the
   * agent; a busy session's next turn tells it instead.
   */
  async answer(tenantId: string, sessionId: string, id: string, body: AnswerApprovalBody): Promise<Approval> {
    const session = await this.deps.sessions.requireLive(tenantId, sessionId)
    const at = this.now()
    await this.deps.store.expireDue(session.id, at)
    const status = body.decision === 'approve' ? 'approved' : 'denied'
    const note = body.note ?? null
    if (!(await this.deps.store.answer(tenantId, session.id, id, { status, note }, at))) {
      const row = await this.require(tenantId, session.id, id)
      if (row.status === 'expired')
        throw new CairnProblem(
          'approval_expired',
          `approval request ${id} expired unanswered at ${row.expires_at}`,
          {
            expiresAt: row.expires_at,
          },
        )
      throw new CairnProblem('approval_answered', `approval request ${id} was ${row.status} already`, {
        status: row.status,
      })
    }
    await this.deliver(tenantId, session.id, { id, decision: body.decision, note })
    return toApproval(await this.require(tenantId, session.id, id))
  }

  /** Begins the turn that carries the answer and lets it run; refused (busy, ended): the next turn carries it. */
  private async deliver(tenantId: string, sessionId: string, answer: ApprovalAnswer): Promise<void> {
    const { sessions, logger } = this.deps
    try {
      const handle = await sessions.startTurn(tenantId, sessionId, approvalPrompt(answer))
      void handle
        .run(() => undefined)
        .catch((error: unknown) => logger.warn({ err: error, session: sessionId }, 'the answer turn failed'))
    } catch (error) {
      logger.info(
        { err: error, session: sessionId, approval: answer.id },
        'the answer waits for the next turn of the session',
      )
    }
  }

  private async require(tenantId: string, sessionId: string, id: string) {
    const row = await this.deps.store.get(tenantId, sessionId, id)
    if (!row)
      throw new CairnProblem('approval_not_found', `no approval request ${id} in session ${sessionId}`)
    return row
  }
}
