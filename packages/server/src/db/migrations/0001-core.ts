import type { Migration } from './migration.js'

/** Migrations 1. The first schema: tenants, API keys, agents and their revisions, sessions, turns and messages, status events. */
export const MIGRATIONS_0001: readonly Migration[] = [
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
]
