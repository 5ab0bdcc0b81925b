import type { Dialect } from './migrations/migration.js'

/**
 * Migration 30's triggers: the webhook outbox is written by the database in the statement that
 * writes the event (a session's status change, a turn's end, a snapshot's record, a setup's end),
 * wherever in the code that is, and only for a tenant with an enabled endpoint. So an event is
 * never acknowledged without its outbox row, and a warm turn sends no extra statement for it.
 * Part of a released migration: never edit; add a new migration instead.
 */
export function webhookTriggers(dialect: Dialect): string {
  return SOURCES.map((source) => trigger(dialect, source)).join('\n')
}

interface Source {
  name: string
  /** The event's kind in `webhook_outbox.source`. */
  kind: string
  /** `INSERT ON table` or `UPDATE OF status ON table`. */
  on: string
  /** When the row is an event (PostgreSQL and SQLite spell it the same). */
  when?: string
  /** Where the tenant is: a join to `sessions` (alias `s`) or the row's own column. */
  tenant: 'session' | 'row'
  /** The event's time. */
  at: string
  /** The event's data: name and SQL expression over `NEW` (`json`: the column holds JSON text, nested as such). */
  fields: ([string, string] | [string, string, 'json'])[]
}

const SOURCES: Source[] = [
  {
    name: 'webhook_session_event',
    kind: 'session_event',
    on: 'INSERT ON session_events',
    tenant: 'session',
    at: 'NEW.at',
    fields: [
      ['eventId', 'NEW.id'],
      ['sessionId', 'NEW.session_id'],
      ['agentId', 's.agent_id'],
      ['from', 'NEW.from_status'],
      ['to', 'NEW.to_status'],
      ['cause', 'NEW.cause'],
      ['detail', 'NEW.detail'],
      ['at', 'NEW.at'],
    ],
  },
  {
    name: 'webhook_turn_ended',
    kind: 'turn',
    on: 'UPDATE OF status ON turns',
    when: "OLD.status = 'running' AND NEW.status <> 'running'",
    tenant: 'session',
    at: 'COALESCE(NEW.ended_at, NEW.started_at)',
    fields: [
      ['turnId', 'NEW.id'],
      ['sessionId', 'NEW.session_id'],
      ['agentId', 's.agent_id'],
      ['turn', 'NEW.seq'],
      ['status', 'NEW.status'],
      ['errorCode', 'NEW.error_code'],
      ['errorMessage', 'NEW.error_message'],
      ['durationMs', 'NEW.duration_ms'],
      ['endedAt', 'NEW.ended_at'],
    ],
  },
  {
    name: 'webhook_snapshot_taken',
    kind: 'snapshot',
    on: 'INSERT ON snapshots',
    tenant: 'row',
    at: 'NEW.created_at',
    fields: [
      ['snapshotId', 'NEW.id'],
      ['sessionId', 'NEW.session_id'],
      ['kind', 'NEW.kind'],
      ['reason', 'NEW.reason'],
      ['label', 'NEW.label'],
      ['turn', 'NEW.turn_seq'],
      ['createdAt', 'NEW.created_at'],
    ],
  },
  {
    name: 'webhook_setup_finished',
    kind: 'setup',
    on: 'UPDATE OF status ON session_setups',
    when: "OLD.status = 'running' AND NEW.status IN ('succeeded', 'failed')",
    tenant: 'session',
    at: 'COALESCE(NEW.ended_at, NEW.started_at)',
    fields: [
      ['sessionId', 'NEW.session_id'],
      ['agentId', 's.agent_id'],
      ['status', 'NEW.status'],
      ['attempts', 'NEW.attempts'],
      ['exitCode', 'NEW.exit_code'],
      ['error', 'NEW.error'],
      ['endedAt', 'NEW.ended_at'],
    ],
  },
]

/** A JSON text column's value nested in the data as JSON (NULL stays null). */
function nested(dialect: Dialect, expr: string): string {
  return dialect === 'sqlite' ? `json(${expr})` : `CAST(${expr} AS json)`
}

/**
 * Migration 35's triggers: an approval request recorded (`approval.requested`) and its first
 * change from `pending` (`approval.answered` when approved or denied, `approval.expired`).
 * Part of a released migration once landed: never edit; add a new migration instead.
 */
export function approvalWebhookTriggers(dialect: Dialect): string {
  return APPROVAL_SOURCES.map((source) => trigger(dialect, source)).join('\n')
}

const APPROVAL_SOURCES: Source[] = [
  {
    name: 'webhook_approval_requested',
    kind: 'approval',
    on: 'INSERT ON approvals',
    tenant: 'session',
    at: 'NEW.requested_at',
    fields: [
      ['approvalId', 'NEW.id'],
      ['sessionId', 'NEW.session_id'],
      ['agentId', 's.agent_id'],
      ['turnId', 'NEW.turn_id'],
      ['status', 'NEW.status'],
      ['summary', 'NEW.summary'],
      ['action', 'NEW.action_json', 'json'],
      ['snapshotId', 'NEW.snapshot_id'],
      ['requestedAt', 'NEW.requested_at'],
      ['expiresAt', 'NEW.expires_at'],
    ],
  },
  {
    name: 'webhook_approval_answered',
    kind: 'approval_answer',
    on: 'UPDATE OF status ON approvals',
    when: "OLD.status = 'pending' AND NEW.status <> 'pending'",
    tenant: 'session',
    at: 'COALESCE(NEW.answered_at, NEW.expires_at, NEW.requested_at)',
    fields: [
      ['approvalId', 'NEW.id'],
      ['sessionId', 'NEW.session_id'],
      ['agentId', 's.agent_id'],
      ['status', 'NEW.status'],
      ['note', 'NEW.note'],
      ['summary', 'NEW.summary'],
      ['requestedAt', 'NEW.requested_at'],
      ['answeredAt', 'NEW.answered_at'],
      ['expiresAt', 'NEW.expires_at'],
    ],
  },
]

/** The outbox row for `NEW`, if its tenant has an enabled endpoint. */
function outboxInsert(dialect: Dialect, source: Source): string {
  const json = dialect === 'sqlite' ? 'json_object' : 'json_build_object'
  const pairs = source.fields
    .map(([name, expr, json]) => `'${name}', ${json ? nested(dialect, expr) : expr}`)
    .join(', ')
  const data = dialect === 'sqlite' ? `${json}(${pairs})` : `CAST(${json}(${pairs}) AS text)`
  const tenant = source.tenant === 'session' ? 's.tenant_id' : 'NEW.tenant_id'
  const from = source.tenant === 'session' ? ' FROM sessions s WHERE s.id = NEW.session_id AND' : ' WHERE'
  return `INSERT INTO webhook_outbox (tenant_id, source, data, at)
    SELECT ${tenant}, '${source.kind}', ${data}, ${source.at}${from}
      EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.tenant_id = ${tenant} AND e.enabled = 1);`
}

function trigger(dialect: Dialect, source: Source): string {
  const [event, table] = source.on.split(' ON ') as [string, string]
  if (dialect === 'sqlite')
    return `CREATE TRIGGER ${source.name} AFTER ${source.on} FOR EACH ROW${source.when ? ` WHEN ${source.when}` : ''}
BEGIN
  ${outboxInsert(dialect, source)}
END;`
  return `CREATE FUNCTION ${source.name}() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
  ${outboxInsert(dialect, source)}
  RETURN NULL;
END
$body$;
CREATE TRIGGER ${source.name} AFTER ${event} ON ${table} FOR EACH ROW${source.when ? ` WHEN (${source.when})` : ''} EXECUTE FUNCTION ${source.name}();`
}
