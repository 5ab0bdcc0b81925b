import { storageTriggers } from './storage-triggers.js'
import { approvalWebhookTriggers, webhookTriggers } from './webhook-triggers.js'

/**
 * Schema migrations, applied in order, each once. Never edit a released one; add a new one.
 * Written in SQLite's dialect; `forDialect` turns each into PostgreSQL's (see there). `dialectSql`
 * is what the two spell too differently for that (triggers), appended as given.
 */
export const MIGRATIONS: readonly {
  version: number
  name: string
  sql: string
  dialectSql?: (dialect: Dialect) => string
}[] = [
  {
    version: 1,
    name: 'core',
    sql: `
CREATE TABLE tenants (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  created_at TEXT NOT NULL
);
CREATE TABLE api_keys (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  hash TEXT NOT NULL UNIQUE,
  prefix TEXT NOT NULL,
  role TEXT NOT NULL,
  name TEXT,
  created_at TEXT NOT NULL,
  last_used_at TEXT,
  revoked_at TEXT
);
CREATE TABLE agents (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  name TEXT NOT NULL,
  current_revision_id TEXT,
  created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL,
  deleted_at TEXT
);
CREATE UNIQUE INDEX agents_tenant_name ON agents(tenant_id, name) WHERE deleted_at IS NULL;
CREATE TABLE revisions (
  id TEXT PRIMARY KEY,
  agent_id TEXT NOT NULL REFERENCES agents(id),
  tenant_id TEXT NOT NULL,
  status TEXT NOT NULL,
  content_hash TEXT NOT NULL,
  manifest_json TEXT NOT NULL,
  file_count INTEGER NOT NULL,
  size_bytes INTEGER NOT NULL,
  error TEXT,
  created_at TEXT NOT NULL
);
CREATE INDEX revisions_agent ON revisions(agent_id, created_at DESC);
CREATE TABLE sessions (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  agent_id TEXT NOT NULL REFERENCES agents(id),
  revision_id TEXT NOT NULL REFERENCES revisions(id),
  title TEXT,
  status TEXT NOT NULL,
  status_cause TEXT NOT NULL,
  turn_count INTEGER NOT NULL DEFAULT 0,
  message_count INTEGER NOT NULL DEFAULT 0,
  idle_timeout_ms INTEGER NOT NULL,
  keep_warm_ms INTEGER NOT NULL,
  created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL,
  last_active_at TEXT NOT NULL
);
CREATE INDEX sessions_tenant_created ON sessions(tenant_id, created_at DESC, id DESC);
CREATE INDEX sessions_tenant_agent ON sessions(tenant_id, agent_id, created_at DESC, id DESC);
CREATE INDEX sessions_tenant_status ON sessions(tenant_id, status, created_at DESC, id DESC);
CREATE INDEX sessions_status_active ON sessions(status, last_active_at);
CREATE TABLE turns (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL REFERENCES sessions(id),
  seq INTEGER NOT NULL,
  status TEXT NOT NULL,
  prompt TEXT NOT NULL,
  response TEXT NOT NULL DEFAULT '',
  stderr TEXT NOT NULL DEFAULT '',
  sandbox_id TEXT,
  cold_start INTEGER NOT NULL DEFAULT 0,
  error_code TEXT,
  error_message TEXT,
  started_at TEXT NOT NULL,
  ended_at TEXT,
  duration_ms INTEGER,
  UNIQUE(session_id, seq)
);
CREATE TABLE session_events (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL REFERENCES sessions(id),
  from_status TEXT,
  to_status TEXT NOT NULL,
  cause TEXT NOT NULL,
  detail TEXT,
  at TEXT NOT NULL
);
CREATE INDEX session_events_session ON session_events(session_id, at);
`,
  },
  {
    version: 2,
    name: 'secrets',
    sql: `
CREATE TABLE secrets (
  agent_id TEXT NOT NULL REFERENCES agents(id),
  tenant_id TEXT NOT NULL,
  name TEXT NOT NULL,
  scope TEXT NOT NULL,
  ciphertext BLOB NOT NULL,
  iv BLOB NOT NULL,
  tag BLOB NOT NULL,
  key_version INTEGER NOT NULL,
  created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL,
  PRIMARY KEY (agent_id, name)
);
`,
  },
  {
    version: 3,
    name: 'snapshots',
    sql: `
CREATE TABLE snapshots (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL REFERENCES sessions(id),
  tenant_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  reason TEXT NOT NULL,
  label TEXT,
  turn_seq INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  digest TEXT,
  created_at TEXT NOT NULL,
  deleted_at TEXT
);
CREATE INDEX snapshots_session ON snapshots(session_id, created_at);
ALTER TABLE sessions ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN parent_session_id TEXT;
ALTER TABLE sessions ADD COLUMN forked_from_snapshot_id TEXT;
`,
  },
  {
    version: 4,
    name: 'session auto snapshots',
    sql: `ALTER TABLE sessions ADD COLUMN auto_snapshots INTEGER NOT NULL DEFAULT 1;`,
  },
  {
    version: 5,
    name: 'session leases',
    sql: `ALTER TABLE sessions ADD COLUMN lease_until TEXT;`,
  },
  {
    version: 6,
    name: 'retention',
    sql: `
CREATE TABLE retention_policies (
  tenant_id TEXT PRIMARY KEY,
  keep_auto_snapshots INTEGER NOT NULL,
  ended_snapshot_ttl_ms INTEGER,
  ended_workspace_ttl_ms INTEGER,
  updated_at TEXT NOT NULL
);
CREATE TABLE retention_events (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  session_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  target_id TEXT NOT NULL,
  bytes_freed INTEGER NOT NULL,
  reason TEXT NOT NULL,
  at TEXT NOT NULL
);
CREATE INDEX retention_events_tenant ON retention_events(tenant_id, at);
`,
  },
  {
    version: 7,
    name: 'egress',
    sql: `
ALTER TABLE sessions ADD COLUMN network_json TEXT;
CREATE TABLE network_events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  session_id TEXT NOT NULL,
  at TEXT NOT NULL,
  host TEXT NOT NULL,
  port INTEGER NOT NULL,
  method TEXT NOT NULL,
  allowed INTEGER NOT NULL,
  reason TEXT NOT NULL,
  address TEXT
);
CREATE INDEX network_events_session ON network_events(session_id, id);
`,
  },
  {
    version: 8,
    name: 'memory, artifacts, ephemeral sessions',
    sql: `
CREATE TABLE agent_memory (
  agent_id TEXT NOT NULL REFERENCES agents(id),
  version INTEGER NOT NULL,
  content TEXT NOT NULL,
  source TEXT NOT NULL,
  created_at TEXT NOT NULL,
  PRIMARY KEY (agent_id, version)
);
CREATE TABLE artifacts (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  agent_id TEXT NOT NULL,
  session_id TEXT NOT NULL,
  path TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  created_at TEXT NOT NULL
);
CREATE INDEX artifacts_agent ON artifacts(agent_id, created_at);
ALTER TABLE sessions ADD COLUMN ephemeral INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN keep_transcript INTEGER NOT NULL DEFAULT 1;
`,
  },
  {
    version: 9,
    name: 'session id prefix index',
    sql: `CREATE INDEX sessions_tenant_id ON sessions(tenant_id, id);`,
  },
  {
    version: 10,
    name: 'session lifecycle policy',
    sql: `
ALTER TABLE sessions ADD COLUMN max_turns INTEGER;
ALTER TABLE sessions ADD COLUMN max_duration_ms INTEGER;
ALTER TABLE sessions ADD COLUMN deadline_at TEXT;
ALTER TABLE sessions ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'keep';
`,
  },
  {
    version: 12,
    name: 'per-session setup phase',
    sql: `
CREATE TABLE session_setups (
  session_id TEXT PRIMARY KEY REFERENCES sessions(id),
  command_json TEXT NOT NULL,
  env_json TEXT NOT NULL,
  network_json TEXT,
  timeout_ms INTEGER,
  status TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  exit_code INTEGER,
  error TEXT,
  log TEXT NOT NULL DEFAULT '',
  started_at TEXT,
  ended_at TEXT,
  snapshot_id TEXT
);
`,
  },
  {
    version: 13,
    name: 'proxy-scoped secrets',
    sql: `
ALTER TABLE secrets ADD COLUMN stand_in TEXT;
ALTER TABLE secrets ADD COLUMN hosts_json TEXT;
`,
  },
  {
    // A turn that changed nothing in the workspace reuses the snapshot before it as the one before
    // the next turn: the snapshot then stands for the state after every turn up to this one.
    version: 14,
    name: 'snapshots reused across unchanged turns',
    sql: `ALTER TABLE snapshots ADD COLUMN through_turn_seq INTEGER;`,
  },
  {
    // Signed preview URLs carry the epoch they were issued in; revoking moves it on. Port 0 stands
    // for every port of the session (a session's end revokes them all).
    version: 15,
    name: 'revocable preview URLs',
    sql: `
CREATE TABLE preview_url_epochs (
  session_id TEXT NOT NULL REFERENCES sessions(id),
  port INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  PRIMARY KEY (session_id, port)
);
`,
  },
  {
    // A proxy secret is swapped into the credential headers only; these name more, per secret.
    version: 16,
    name: 'proxy secret headers',
    sql: `
ALTER TABLE secrets ADD COLUMN headers_json TEXT;
`,
  },
  {
    // Two API replicas (or two requests racing) can never run two turns of one session: the
    // database refuses a second running turn. A crash could have left more than one (older code
    // held the lock in memory only): all but the newest become interrupted first.
    version: 17,
    name: 'one running turn per session',
    sql: `
UPDATE turns SET status = 'interrupted', ended_at = COALESCE(ended_at, started_at)
  WHERE status = 'running'
    AND seq < (SELECT MAX(t2.seq) FROM turns t2 WHERE t2.session_id = turns.session_id AND t2.status = 'running');
CREATE UNIQUE INDEX turns_one_running ON turns(session_id) WHERE status = 'running';
`,
  },
  {
    // With a shared database (PostgreSQL) every replica must reach what one of them wrote: the
    // files all of them hold the same copy of (the secrets key, the egress CA), build logs and
    // artifact bytes. On SQLite they are written here too; files in the data dir stay readable.
    version: 18,
    name: 'shared files, build logs and artifact bytes in the database',
    sql: `
CREATE TABLE shared_files (
  name TEXT PRIMARY KEY,
  content BLOB NOT NULL,
  created_at TEXT NOT NULL
);
CREATE TABLE build_logs (
  revision_id TEXT PRIMARY KEY,
  log TEXT NOT NULL
);
CREATE TABLE artifact_blobs (
  artifact_id TEXT PRIMARY KEY,
  content BLOB NOT NULL
);
`,
  },
  {
    // The runtime (a replica's data dir: its pool, its sandboxes) that owns the session. Rows
    // from before have none: the first server to start claims them (see SessionStore.claimUnowned).
    version: 19,
    name: 'session owner runtime',
    sql: `
ALTER TABLE sessions ADD COLUMN runtime_id TEXT;
CREATE INDEX sessions_runtime_status ON sessions(runtime_id, status);
`,
  },
  {
    // A session's own `pause` (stop | memory) over its agent's cairn.yaml; NULL: the agent's.
    version: 20,
    name: 'session pause policy',
    sql: `
ALTER TABLE sessions ADD COLUMN pause TEXT;
`,
  },
  {
    // A cluster's runtime nodes (PostgreSQL; the tables exist on SQLite too, unused there). A
    // node's ID is its runtime ID; `epoch` counts its registrations, and a session's
    // `owner_epoch` goes up whenever its owner changes or is declared lost, so a stale owner's
    // writes change nothing. `revision_nodes`: which nodes hold a revision.
    version: 21,
    name: 'cluster nodes and session owner epochs',
    sql: `
ALTER TABLE sessions ADD COLUMN owner_epoch INTEGER NOT NULL DEFAULT 0;
CREATE TABLE nodes (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  address TEXT NOT NULL,
  boot_id TEXT NOT NULL,
  state TEXT NOT NULL,
  drivers TEXT NOT NULL,
  cpus INTEGER NOT NULL,
  warm_sandboxes INTEGER NOT NULL DEFAULT 0,
  pool_free_bytes INTEGER,
  pool_size_bytes INTEGER,
  epoch INTEGER NOT NULL,
  lease_expires_at TEXT NOT NULL,
  heartbeat_at TEXT NOT NULL,
  registered_at TEXT NOT NULL,
  lost_at TEXT
);
CREATE TABLE revision_nodes (
  revision_id TEXT NOT NULL,
  runtime_id TEXT NOT NULL,
  PRIMARY KEY (revision_id, runtime_id)
);
`,
  },
  {
    // What of a session's workspace is safe in the shipping bucket (docs/shipping.md): the newest
    // snapshot whose chain link the bucket confirmed, its workspace generation and when. Written by
    // the owning node only while the session's owner_epoch is still the one it serves, so a stale
    // node's late confirmation changes nothing; read when a lost node's session is recovered.
    version: 22,
    name: 'shipped workspace snapshots',
    sql: `
ALTER TABLE sessions ADD COLUMN shipped_generation INTEGER;
ALTER TABLE sessions ADD COLUMN shipped_snapshot_id TEXT;
ALTER TABLE sessions ADD COLUMN shipped_at TEXT;
`,
  },
  {
    // The chain link of that snapshot and its tree's digest, written with the rest by the owning
    // node under its epoch: a restore (node-loss recovery, a move) ends at exactly this link and
    // checks the restored tree against this digest, so a newer link anyone with the bucket's keys
    // adds is never taken as the session's workspace (docs/security.md).
    version: 23,
    name: 'pinned shipped chain head',
    sql: `
ALTER TABLE sessions ADD COLUMN shipped_link_seq INTEGER;
ALTER TABLE sessions ADD COLUMN shipped_tree_digest TEXT;
`,
  },
  {
    // An exclusive operation on a session (a restore, an import, a snapshot, a move) holds it in
    // the database, not only in the memory of the replica doing it: a turn begun through another
    // replica is refused while it lasts, and it is refused while a turn runs. `held_until` lets a
    // hold of a replica that died lapse; `held_swaps` says the operation swaps the workspace, and
    // `swap_count` moves on as each such hold is taken: a read through another replica that saw
    // either met a swap.
    version: 24,
    name: 'session holds',
    sql: `
ALTER TABLE sessions ADD COLUMN held_for TEXT;
ALTER TABLE sessions ADD COLUMN held_by TEXT;
ALTER TABLE sessions ADD COLUMN held_until TEXT;
ALTER TABLE sessions ADD COLUMN held_swaps INTEGER;
ALTER TABLE sessions ADD COLUMN swap_count INTEGER NOT NULL DEFAULT 0;
`,
  },
  {
    // When each session may next time out (idle timeout, max duration), indexed: the reaper reads
    // the sessions due, never every idle one (sessions/deadline-index.ts). Never later than the
    // true time; the epoch for every idle or active session of an older install, so the first
    // pass reads each once and sets its true time.
    version: 25,
    name: 'session deadline index',
    sql: `
ALTER TABLE sessions ADD COLUMN next_due_at TEXT;
UPDATE sessions SET next_due_at = '1970-01-01T00:00:00.000Z' WHERE status IN ('idle', 'active');
CREATE INDEX sessions_next_due ON sessions(next_due_at, id) WHERE next_due_at IS NOT NULL;
`,
  },
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
]

export type Dialect = 'sqlite' | 'postgres'

/** Tables read back in insertion order (SQLite's implicit `rowid`): PostgreSQL gets the column. */
const INSERTION_ORDERED = ['session_events', 'snapshots']

/**
 * A migration's SQL for the dialect. PostgreSQL differs in a few words only: 64-bit integers
 * (sizes and durations outgrow 32 bits), BYTEA for BLOB, an identity column for AUTOINCREMENT,
 * byte-order collation (as SQLite compares text, so ID prefix ranges and cursors agree) and an
 * explicit `rowid` where rows are read back in insertion order.
 */
export function forDialect(sql: string, dialect: Dialect): string {
  if (dialect === 'sqlite') return sql
  let out = sql
    .replace(/\bINTEGER PRIMARY KEY AUTOINCREMENT\b/g, 'BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY')
    .replace(/\bINTEGER\b/g, 'BIGINT')
    .replace(/\bBLOB\b/g, 'BYTEA')
    .replace(/\bTEXT\b/g, 'TEXT COLLATE "C"')
  for (const table of INSERTION_ORDERED)
    out = out.replace(
      `CREATE TABLE ${table} (`,
      `CREATE TABLE ${table} (\n  rowid BIGINT GENERATED ALWAYS AS IDENTITY,`,
    )
  return out
}
