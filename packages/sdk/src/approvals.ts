import type { Approval, ApprovalDecision, ApprovalStatus } from '@cairn/protocol'
import { checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import * as valid from './validators.js'

export type { Approval, ApprovalDecision, ApprovalStatus }

const path = (id: string, rest = '') => `/v1/sessions/${encodeURIComponent(id)}/approvals${rest}`
const asApproval = (v: unknown): Approval => checked(valid.Approval, v, 'approval')

export interface AnswerOptions extends RequestOptions {
  /** Told to the agent with the answer. */
  note?: string | undefined
}

/**
 * A session's approval requests (human review, docs/approvals.md): what its agent asked to do,
 * the review snapshot, and the answer; a write key answers, and a turn carries it to the agent.
 */
export class Approvals {
  constructor(
    private readonly http: HttpClient,
    private readonly sessionId: string,
  ) {}

  /** Every request of the session, newest first. */
  async list(options: RequestOptions = {}): Promise<Approval[]> {
    const body = await this.http.json({ method: 'GET', path: path(this.sessionId), ...options })
    return checked(valid.ApprovalList, body, 'approval list').data
  }

  async get(approvalId: string, options: RequestOptions = {}): Promise<Approval> {
    const rest = `/${encodeURIComponent(approvalId)}`
    return asApproval(await this.http.json({ method: 'GET', path: path(this.sessionId, rest), ...options }))
  }

  /** Approves or denies a pending request (`ConflictError` once answered or expired). */
  async answer(
    approvalId: string,
    decision: ApprovalDecision,
    options: AnswerOptions = {},
  ): Promise<Approval> {
    const { note, ...request } = options
    const rest = `/${encodeURIComponent(approvalId)}/answer`
    const json = { decision, ...(note === undefined ? {} : { note }) }
    return asApproval(
      await this.http.json({ method: 'POST', path: path(this.sessionId, rest), json, ...request }),
    )
  }

  approve(approvalId: string, options: AnswerOptions = {}): Promise<Approval> {
    return this.answer(approvalId, 'approve', options)
  }

  deny(approvalId: string, options: AnswerOptions = {}): Promise<Approval> {
    return this.answer(approvalId, 'deny', options)
  }
}
