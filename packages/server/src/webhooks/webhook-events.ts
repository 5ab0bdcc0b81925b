import type { WebhookEventType, WebhookMessage } from '@cairn/protocol'

/** An outbox row as the triggers write it (db/webhook-triggers.ts). */
export interface OutboxEvent {
  source: string
  /** The row's fields, as JSON text. */
  data: string
  at: string
}

/**
 * The messages an outbox row stands for: a status change is `session.status_changed` (and
 * `session.node_lost` when that was its cause), a turn's end `turn.completed`, `turn.cancelled`
 * or `turn.failed` (failed or interrupted), a snapshot `snapshot.taken`, a setup's end
 * `setup.finished`, an approval request `approval.requested`, its answer `approval.answered` or
 * its expiry `approval.expired`. A row of a source this code does not know stands for none.
 */
export function messagesOf(event: OutboxEvent): WebhookMessage[] {
  const data = JSON.parse(event.data) as Record<string, unknown>
  return typesOf(event.source, data).map((type) => ({ type, timestamp: event.at, data }))
}

function typesOf(source: string, data: Record<string, unknown>): WebhookEventType[] {
  switch (source) {
    case 'session_event':
      return data.cause === 'node_lost'
        ? ['session.status_changed', 'session.node_lost']
        : ['session.status_changed']
    case 'turn':
      return [
        data.status === 'completed'
          ? 'turn.completed'
          : data.status === 'cancelled'
            ? 'turn.cancelled'
            : 'turn.failed',
      ]
    case 'snapshot':
      return ['snapshot.taken']
    case 'setup':
      return ['setup.finished']
    case 'approval':
      return ['approval.requested']
    case 'approval_answer':
      return [data.status === 'expired' ? 'approval.expired' : 'approval.answered']
    default:
      return []
  }
}

/** The wait before attempt `attempt + 1` (attempt counts from 1): base × 4^(attempt−1), at most 6 h. */
export function retryDelayMs(attempt: number, baseMs: number): number {
  return Math.min(baseMs * 4 ** Math.max(0, attempt - 1), 6 * 3600 * 1000)
}
