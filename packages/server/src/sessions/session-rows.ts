import type { PausePolicy, SessionInfo, SessionStatus, TurnStatus } from '@cairn/protocol'
import { policyOf } from './policy.js'

/** The rows of sessions and turns as the stores read them, and what is derived from them alone. */

export interface SessionRow {
  /**
   * Read with the row a turn begins from (`getForTurn`): whether a live snapshot stood then for
   * the state after turn `turn_count` (SQLite answers 0 or 1). Undefined: not read.
   */
  snapshot_stands?: boolean | number | undefined
  id: string
  tenant_id: string
  agent_id: string
  agent_name: string
  revision_id: string
  title: string | null
  status: SessionStatus
  status_cause: string
  turn_count: number
  message_count: number
  idle_timeout_ms: number
  keep_warm_ms: number
  created_at: string
  updated_at: string
  last_active_at: string
  generation: number
  parent_session_id: string | null
  forked_from_snapshot_id: string | null
  auto_snapshots: number
  lease_until: string | null
  network_json: string | null
  ephemeral: number
  keep_transcript: number
  max_turns: number | null
  max_duration_ms: number | null
  deadline_at: string | null
  on_timeout: string
  runtime_id: string | null
  /** Goes up whenever the session's owner (node) changes or is declared lost (cluster). */
  owner_epoch: number
  /** The session's own pause policy; null: the agent's. */
  pause: PausePolicy | null
  /** How long an approval request may wait (policy `approvalTimeoutMs`); null: no limit. */
  approval_timeout_ms: number | null
  /** The approval request whose answer (or expiry) the agent has not had yet. */
  approval_id: string | null
}

export interface TurnRow {
  id: string
  session_id: string
  seq: number
  status: TurnStatus
  prompt: string
  response: string
  stderr: string
  sandbox_id: string | null
  error_code: string | null
  error_message: string | null
  started_at: string
  ended_at: string | null
  duration_ms: number | null
}

export interface InterruptedTurn {
  sessionId: string
  tenantId: string
  seq: number
}

export interface ListFilter {
  agentId?: string | undefined
  status?: SessionStatus | undefined
  limit: number
  cursor?: { createdAt: string; id: string } | undefined
}

export type NewSession = Omit<
  SessionRow,
  | 'agent_name'
  | 'turn_count'
  | 'message_count'
  | 'updated_at'
  | 'last_active_at'
  | 'generation'
  | 'parent_session_id'
  | 'forked_from_snapshot_id'
  | 'auto_snapshots'
  | 'lease_until'
  | 'network_json'
  | 'ephemeral'
  | 'keep_transcript'
  | 'runtime_id'
  | 'owner_epoch'
  | 'pause'
  | 'approval_id'
> & {
  pause?: PausePolicy | null
  auto_snapshots?: number
  network_json?: string | null
  ephemeral?: number
  keep_transcript?: number
  generation?: number
}

export const TIMING_COLUMNS = [
  'status',
  'last_active_at',
  'idle_timeout_ms',
  'lease_until',
  'deadline_at',
] as const

export function toSessionInfo(row: SessionRow, warm: boolean): SessionInfo {
  return {
    id: row.id,
    agentId: row.agent_id,
    agentName: row.agent_name,
    revisionId: row.revision_id,
    title: row.title,
    status: row.status,
    statusCause: row.status_cause,
    turnCount: row.turn_count,
    messageCount: row.message_count,
    idleTimeoutMs: row.idle_timeout_ms,
    keepWarmMs: row.keep_warm_ms,
    policy: policyOf(row),
    deadlineAt: row.deadline_at,
    generation: row.generation,
    autoSnapshots: row.auto_snapshots !== 0,
    ephemeral: row.ephemeral === 1,
    pause: row.pause,
    warm,
    approvalId: row.approval_id ?? null,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    lastActiveAt: row.last_active_at,
  }
}

export interface SessionTiming {
  status: SessionStatus
  last_active_at: string
  idle_timeout_ms: number
  lease_until: string | null
  deadline_at: string | null
}

/** An idle session times out at its idle timeout (held off by a lease); idle or active, at its deadline. */
export function dueOf(row: SessionTiming): number | undefined {
  let due: number | undefined
  if (row.status === 'idle') {
    const idleDue = Date.parse(row.last_active_at) + row.idle_timeout_ms
    due = row.lease_until ? Math.max(idleDue, Date.parse(row.lease_until)) : idleDue
  }
  if (row.deadline_at && (row.status === 'idle' || row.status === 'active')) {
    const deadline = Date.parse(row.deadline_at)
    due = due === undefined ? deadline : Math.min(due, deadline)
  }
  return due
}
