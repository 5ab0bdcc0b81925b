/**
 * The protocol's names as plain constants, without TypeBox: what clients need at run time (the
 * SDK, the CLI) loads from here (`@cairn/protocol/core`) and so starts without building any schema.
 */

/** Server-sent events of a run (`POST /v1/sessions/{id}/messages`). */
export const SSE_EVENT_NAMES = [
  'run.started',
  'message.delta',
  'tool.start',
  'tool.end',
  'status',
  'run.completed',
  'run.failed',
  'run.cancelled',
  'heartbeat',
] as const
export type SseEventName = (typeof SSE_EVENT_NAMES)[number]

export const SESSION_STATUSES = ['active', 'idle', 'completed', 'failed', 'timeout', 'deleted'] as const
export type SessionStatus = (typeof SESSION_STATUSES)[number]

/** What a webhook endpoint can subscribe to (docs/webhooks.md). */
export const WEBHOOK_EVENT_TYPES = [
  /** Every session status change, with its cause (`data.from`, `data.to`, `data.cause`, `data.detail`). */
  'session.status_changed',
  /** The session's node was declared lost (cluster); also sent as a `session.status_changed`. */
  'session.node_lost',
  'turn.completed',
  /** A turn that failed or was interrupted (`data.status`, `data.errorCode`). */
  'turn.failed',
  'turn.cancelled',
  'snapshot.taken',
  /** The session's setup phase ended (`data.status`: succeeded | failed). */
  'setup.finished',
  /** An agent asked for approval (docs/approvals.md): `data.approvalId`, `summary`, `action`, `snapshotId`. */
  'approval.requested',
  /** A write key approved or denied a request (`data.status`: approved | denied, `data.note`). */
  'approval.answered',
  /** A request nobody answered passed its `expiresAt`. */
  'approval.expired',
] as const
export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number]

export const WEBHOOK_DELIVERY_STATUSES = ['pending', 'delivered', 'failed'] as const
export type WebhookDeliveryStatus = (typeof WEBHOOK_DELIVERY_STATUSES)[number]
