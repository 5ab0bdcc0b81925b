import type { Migration } from './migration.js'

/** Migrations 2–13. Sessions grow: secrets, snapshots, leases, retention, egress, memory, artifacts, lifecycle policies, setup phases. */
export const MIGRATIONS_0002: readonly Migration[] = [
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
]
