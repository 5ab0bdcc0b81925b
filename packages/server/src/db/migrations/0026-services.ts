import { nodeRoleMigration } from '../node-role.js'
import { storageTriggers } from '../storage-triggers.js'
import { approvalWebhookTriggers, webhookTriggers } from '../webhook-triggers.js'
import type { Migration } from './migration.js'

/** Migrations 26–38. Services on top: turn events, replica leases, storage reservations, AG-UI, webhooks, commands, retention layers, approvals, resume runs, tenant storage, the held sessions' index, the nodes' role. */
export const MIGRATIONS_0026: readonly Migration[] = [
  {
    // Every event a turn streamed (its JSON), numbered from 1 in the turn: the id of its SSE
    // message. A client whose stream dropped gets, through any replica, exactly the events after
    // the last id it saw. Written in batches, not per event (see docs/architecture.md).
    version: 26,
    name: 'turn events',
    sql: `
CREATE TABLE turn_events (
  turn_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  type TEXT NOT NULL,
  event TEXT NOT NULL,
  PRIMARY KEY (turn_id, seq)
);
`,
  },
  {
    // A turn belongs to the live process that relays it, not only to its row: each API replica
    // process (`--role api`) keeps a lease here, renewed every heartbeat on the database's clock,
    // and records itself on every turn it begins (`turns.relay_id`). A running turn whose relay's
    // lease ended (a replica killed, partitioned, stopped) is ended `replica_lost` by the leader; a
    // replica started again in the same data dir (`replica_id`) ends its predecessors' at its start.
    version: 27,
    name: 'replica leases',
    sql: `
CREATE TABLE replicas (
  id TEXT PRIMARY KEY,
  replica_id TEXT NOT NULL,
  started_at TEXT NOT NULL,
  lease_until TEXT NOT NULL,
  stopped_at TEXT
);
CREATE INDEX replicas_by_replica ON replicas (replica_id);
ALTER TABLE turns ADD COLUMN relay_id TEXT;
CREATE INDEX turns_running_relay ON turns (relay_id) WHERE status = 'running';
`,
  },
  {
    // Space a tenant's storage budget holds for work under way (an artifact being copied): every
    // replica's admission check counts it, so concurrent requests cannot each pass the same check.
    // A row outlives its copy by at most its lease (`expires_at`, renewed while the copy runs).
    version: 28,
    name: 'storage reservations',
    sql: `
CREATE TABLE storage_reservations (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  purpose TEXT NOT NULL,
  expires_at TEXT NOT NULL
);
CREATE INDEX storage_reservations_tenant ON storage_reservations (tenant_id, expires_at);
CREATE INDEX artifacts_tenant ON artifacts (tenant_id);
`,
  },
  {
    // AG-UI front ends name their threads themselves (a UUID per conversation): each name a
    // tenant gives one of its agents stands for one session, made at the thread's first run.
    version: 29,
    name: 'ag-ui threads',
    sql: `
CREATE TABLE ag_ui_threads (
  tenant_id TEXT NOT NULL,
  agent_id TEXT NOT NULL,
  thread_id TEXT NOT NULL,
  session_id TEXT NOT NULL,
  created_at TEXT NOT NULL,
  PRIMARY KEY (tenant_id, agent_id, thread_id)
);
`,
  },
  {
    // Lifecycle webhooks (docs/webhooks.md): a tenant's endpoints; the outbox, written by
    // triggers (webhook-triggers.ts) in the statement that writes each event; one delivery per
    // message and endpoint, its attempts kept with it (the delivery log), claimed by one process
    // at a time (`claimed_until`).
    version: 30,
    name: 'webhooks',
    sql: `
CREATE TABLE webhook_endpoints (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  url TEXT NOT NULL,
  events_json TEXT NOT NULL,
  description TEXT,
  enabled INTEGER NOT NULL DEFAULT 1,
  created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL
);
CREATE INDEX webhook_endpoints_tenant ON webhook_endpoints (tenant_id, created_at);
CREATE TABLE webhook_outbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant_id TEXT NOT NULL,
  source TEXT NOT NULL,
  data TEXT NOT NULL,
  at TEXT NOT NULL
);
CREATE TABLE webhook_deliveries (
  id TEXT PRIMARY KEY,
  endpoint_id TEXT NOT NULL,
  tenant_id TEXT NOT NULL,
  message_id TEXT NOT NULL,
  event_type TEXT NOT NULL,
  payload TEXT NOT NULL,
  status TEXT NOT NULL,
  attempts_json TEXT NOT NULL DEFAULT '[]',
  next_attempt_at TEXT,
  claimed_until TEXT,
  created_at TEXT NOT NULL,
  ended_at TEXT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at);
CREATE INDEX webhook_deliveries_ended ON webhook_deliveries (ended_at) WHERE ended_at IS NOT NULL;
`,
    dialectSql: webhookTriggers,
  },
  {
    // Commands run in a session's sandbox outside a turn (docs/commands.md): the row any replica
    // reads; the output itself is in a bounded log on the session's node.
    version: 31,
    name: 'commands',
    sql: `
CREATE TABLE commands (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  tenant_id TEXT NOT NULL,
  command_json TEXT NOT NULL,
  cwd TEXT NOT NULL,
  status TEXT NOT NULL,
  exit_code INTEGER,
  signal TEXT,
  end_cause TEXT,
  output_bytes INTEGER NOT NULL DEFAULT 0,
  kept_from_offset INTEGER NOT NULL DEFAULT 0,
  stdin_open INTEGER NOT NULL DEFAULT 0,
  timeout_ms INTEGER NOT NULL,
  max_output_bytes INTEGER NOT NULL,
  started_at TEXT NOT NULL,
  ended_at TEXT
);
CREATE INDEX commands_session ON commands (session_id, started_at);
CREATE INDEX commands_tenant_running ON commands (tenant_id) WHERE status = 'running';
`,
  },
  {
    // Retention on every layer (docs/retention.md): a TTL per layer (NULL keeps; turn events keep
    // their former fixed 24 h as the default), and an optional expiry per secret.
    version: 32,
    name: 'retention_layers',
    sql: `
ALTER TABLE retention_policies ADD COLUMN artifact_ttl_ms INTEGER;
ALTER TABLE retention_policies ADD COLUMN build_log_ttl_ms INTEGER;
ALTER TABLE retention_policies ADD COLUMN setup_log_ttl_ms INTEGER;
ALTER TABLE retention_policies ADD COLUMN memory_version_ttl_ms INTEGER;
ALTER TABLE retention_policies ADD COLUMN network_log_ttl_ms INTEGER;
ALTER TABLE retention_policies ADD COLUMN session_event_ttl_ms INTEGER;
ALTER TABLE retention_policies ADD COLUMN turn_event_ttl_ms INTEGER DEFAULT 86400000;
ALTER TABLE secrets ADD COLUMN expires_at TEXT;
CREATE INDEX secrets_expiry ON secrets (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX network_events_at ON network_events (at);
`,
  },
  {
    // Human review (docs/approvals.md): an agent's approval requests and their answers, read by
    // any replica; a session names the request whose answer its agent has not had yet, and how
    // long one may wait.
    version: 33,
    name: 'approvals',
    sql: `
CREATE TABLE approvals (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  session_id TEXT NOT NULL,
  turn_id TEXT NOT NULL,
  status TEXT NOT NULL,
  summary TEXT NOT NULL,
  action_json TEXT,
  note TEXT,
  snapshot_id TEXT,
  requested_at TEXT NOT NULL,
  expires_at TEXT,
  answered_at TEXT,
  delivered_turn_id TEXT
);
CREATE INDEX approvals_session ON approvals (session_id, requested_at);
ALTER TABLE sessions ADD COLUMN approval_timeout_ms INTEGER;
ALTER TABLE sessions ADD COLUMN approval_id TEXT;
`,
  },
  {
    // The latest run of each session's `session.resume` command (cairn.yaml), with its log.
    version: 34,
    name: 'session_resume_runs',
    sql: `
CREATE TABLE session_resume_runs (
  session_id TEXT PRIMARY KEY,
  command_json TEXT NOT NULL,
  status TEXT NOT NULL,
  runs INTEGER NOT NULL DEFAULT 0,
  exit_code INTEGER,
  error TEXT,
  log TEXT NOT NULL DEFAULT '',
  started_at TEXT,
  ended_at TEXT
);
`,
  },
  {
    // Approval webhooks (docs/webhooks.md): a request recorded, answered or expired writes its
    // outbox row (webhook-triggers.ts); the housekeeping pass expires due requests by this index.
    version: 35,
    name: 'approval_webhooks',
    sql: `
CREATE INDEX approvals_pending_expiry ON approvals (expires_at) WHERE status = 'pending' AND expires_at IS NOT NULL;
`,
    dialectSql: approvalWebhookTriggers,
  },
  {
    // One budget per tenant (docs/architecture/storage.md): the bytes each tenant holds beside
    // the pool, kept by triggers (storage-triggers.ts) with every write and delete, and backfilled
    // here, so a reservation's check reads one row instead of summing the tenant's rows.
    version: 36,
    name: 'tenant_storage',
    sql: `
CREATE TABLE tenant_storage (
  tenant_id TEXT PRIMARY KEY,
  artifact_bytes INTEGER NOT NULL DEFAULT 0,
  command_log_bytes INTEGER NOT NULL DEFAULT 0,
  turn_event_bytes INTEGER NOT NULL DEFAULT 0,
  turn_text_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE session_command_logs (
  session_id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  bytes INTEGER NOT NULL
);
`,
    dialectSql: storageTriggers,
  },
  {
    // The cluster leader releases dead replicas' session holds every second: it finds the held
    // sessions by this index (a handful) instead of reading every session of the install.
    version: 37,
    name: 'sessions_held_index',
    sql: `
CREATE INDEX sessions_held ON sessions (held_by) WHERE held_by IS NOT NULL;
`,
  },
  {
    // A node's least privilege (docs/cluster.md, "The nodes' role"): the role nodes log in as
    // members of, what it may read, its writes through functions that check who calls; a node's
    // row names the role that registered it (none on rows from before: the next registration).
    version: 38,
    name: 'node_role',
    sql: `
ALTER TABLE nodes ADD COLUMN db_role TEXT;
`,
    dialectSql: nodeRoleMigration,
  },
  {
    // The webhook deliverer's poll (webhook-deliverer.ts): the tenants with deliveries due and
    // each tenant's claim of its oldest due ones read this index (the tenant, then when each is
    // due), not every pending delivery of the install.
    version: 39,
    name: 'webhook_deliveries_tenant_due',
    sql: `
CREATE INDEX webhook_deliveries_tenant_due ON webhook_deliveries (tenant_id, next_attempt_at) WHERE status = 'pending';
`,
  },
]
