import type { Generated } from 'kysely'

/**
 * The control plane's tables as Kysely sees them (one description for SQLite and PostgreSQL).
 * Times are ISO-8601 text; flags are 0/1 integers (SQLite has no boolean); JSON is text.
 */
export interface Schema {
  schema_migrations: { version: number; name: string; applied_at: string }
  tenants: { id: string; name: string; created_at: string }
  api_keys: {
    id: string
    tenant_id: string
    hash: string
    prefix: string
    role: string
    name: string | null
    created_at: string
    last_used_at: string | null
    revoked_at: string | null
  }
  agents: {
    id: string
    tenant_id: string
    name: string
    current_revision_id: string | null
    created_at: string
    updated_at: string
    deleted_at: string | null
  }
  revisions: {
    id: string
    agent_id: string
    tenant_id: string
    status: string
    content_hash: string
    manifest_json: string
    file_count: number
    size_bytes: number
    error: string | null
    created_at: string
  }
  sessions: SessionsTable
  turns: {
    id: string
    session_id: string
    seq: number
    status: string
    prompt: string
    response: Generated<string>
    stderr: Generated<string>
    sandbox_id: string | null
    cold_start: Generated<number>
    error_code: string | null
    error_message: string | null
    started_at: string
    ended_at: string | null
    duration_ms: number | null
    /** The API replica process (`replicas.id`) that relays the turn; null where no replica does. */
    relay_id: string | null
  }
  turn_events: { turn_id: string; seq: number; type: string; event: string }
  commands: {
    id: string
    session_id: string
    tenant_id: string
    command_json: string
    cwd: string
    status: string
    exit_code: number | null
    signal: string | null
    end_cause: string | null
    output_bytes: number
    kept_from_offset: number
    stdin_open: number
    timeout_ms: number
    max_output_bytes: number
    started_at: string
    ended_at: string | null
  }
  session_events: {
    id: string
    session_id: string
    from_status: string | null
    to_status: string
    cause: string
    detail: string | null
    at: string
  }
  secrets: {
    agent_id: string
    tenant_id: string
    name: string
    scope: string
    ciphertext: Buffer
    iv: Buffer
    tag: Buffer
    key_version: number
    stand_in: string | null
    hosts_json: string | null
    headers_json: string | null
    /** After this the secret is no longer injected, and the retention pass deletes it; null: never. */
    expires_at: string | null
    created_at: string
    updated_at: string
  }
  snapshots: {
    id: string
    session_id: string
    tenant_id: string
    kind: string
    reason: string
    label: string | null
    turn_seq: number
    through_turn_seq: number | null
    generation: number
    digest: string | null
    created_at: string
    deleted_at: string | null
  }
  retention_policies: {
    tenant_id: string
    keep_auto_snapshots: number
    ended_snapshot_ttl_ms: number | null
    ended_workspace_ttl_ms: number | null
    artifact_ttl_ms: number | null
    build_log_ttl_ms: number | null
    setup_log_ttl_ms: number | null
    memory_version_ttl_ms: number | null
    network_log_ttl_ms: number | null
    session_event_ttl_ms: number | null
    turn_event_ttl_ms: number | null
    updated_at: string
  }
  retention_events: {
    id: string
    tenant_id: string
    session_id: string
    kind: string
    target_id: string
    bytes_freed: number
    reason: string
    at: string
  }
  network_events: {
    id: Generated<number>
    session_id: string
    at: string
    host: string
    port: number
    method: string
    allowed: number
    reason: string
    address: string | null
  }
  agent_memory: { agent_id: string; version: number; content: string; source: string; created_at: string }
  artifacts: {
    id: string
    tenant_id: string
    agent_id: string
    session_id: string
    path: string
    size_bytes: number
    sha256: string
    created_at: string
  }
  session_setups: {
    session_id: string
    command_json: string
    env_json: string
    network_json: string | null
    timeout_ms: number | null
    status: string
    attempts: Generated<number>
    exit_code: number | null
    error: string | null
    log: Generated<string>
    started_at: string | null
    ended_at: string | null
    snapshot_id: string | null
  }
  session_resume_runs: {
    session_id: string
    command_json: string
    status: string
    runs: Generated<number>
    exit_code: number | null
    error: string | null
    log: Generated<string>
    started_at: string | null
    ended_at: string | null
  }
  preview_url_epochs: { session_id: string; port: number; epoch: number }
  shared_files: { name: string; content: Buffer; created_at: string }
  /** A view (PostgreSQL): the shared files a node's role may read. */
  node_shared_files: { name: string; content: Buffer }
  build_logs: { revision_id: string; log: string }
  artifact_blobs: { artifact_id: string; content: Buffer }
  storage_reservations: { id: string; tenant_id: string; bytes: number; purpose: string; expires_at: string }
  tenant_storage: {
    tenant_id: string
    artifact_bytes: number
    command_log_bytes: number
    turn_event_bytes: number
    turn_text_bytes: number
  }
  session_command_logs: { session_id: string; tenant_id: string; bytes: number }
  ag_ui_threads: {
    tenant_id: string
    agent_id: string
    thread_id: string
    session_id: string
    created_at: string
  }
  nodes: NodesTable
  revision_nodes: { revision_id: string; runtime_id: string }
  /** A tenant's webhook endpoints (migration 30); `events_json`: the event types it takes. */
  webhook_endpoints: {
    id: string
    tenant_id: string
    url: string
    events_json: string
    description: string | null
    enabled: Generated<number>
    created_at: string
    updated_at: string
  }
  /** Events waiting to become deliveries, written by triggers (db/webhook-triggers.ts). */
  webhook_outbox: { seq: Generated<number>; tenant_id: string; source: string; data: string; at: string }
  /** One message to one endpoint; `attempts_json`: every attempt (the delivery log). */
  webhook_deliveries: {
    id: string
    endpoint_id: string
    tenant_id: string
    message_id: string
    event_type: string
    payload: string
    status: string
    attempts_json: Generated<string>
    next_attempt_at: string | null
    claimed_until: string | null
    created_at: string
    ended_at: string | null
  }
  replicas: ReplicasTable
  /** Agents' approval requests and their answers (migration 33, docs/approvals.md). */
  approvals: ApprovalsTable
}

export interface ApprovalsTable {
  id: string
  tenant_id: string
  session_id: string
  turn_id: string
  status: string
  summary: string
  /** The agent's `action` as JSON; null: it gave none. */
  action_json: string | null
  note: string | null
  snapshot_id: string | null
  requested_at: string
  expires_at: string | null
  answered_at: string | null
  delivered_turn_id: string | null
}

/**
 * An API replica process's lease (`id` is this process's, `replica_id` its data dir's runtime ID,
 * the same across its restarts); times are the database's clock.
 */
export interface ReplicasTable {
  id: string
  replica_id: string
  started_at: string
  lease_until: string
  stopped_at: string | null
}

/** A cluster's runtime node (its ID is its runtime ID); `drivers` is a JSON array of names. */
export interface NodesTable {
  id: string
  name: string
  address: string
  boot_id: string
  state: string
  drivers: string
  cpus: number
  warm_sandboxes: Generated<number>
  pool_free_bytes: number | null
  pool_size_bytes: number | null
  epoch: number
  lease_expires_at: string
  heartbeat_at: string
  registered_at: string
  lost_at: string | null
}

export interface SessionsTable {
  id: string
  tenant_id: string
  agent_id: string
  revision_id: string
  title: string | null
  status: string
  status_cause: string
  turn_count: Generated<number>
  message_count: Generated<number>
  idle_timeout_ms: number
  keep_warm_ms: number
  created_at: string
  updated_at: string
  last_active_at: string
  generation: Generated<number>
  parent_session_id: string | null
  forked_from_snapshot_id: string | null
  auto_snapshots: Generated<number>
  lease_until: string | null
  network_json: string | null
  ephemeral: Generated<number>
  keep_transcript: Generated<number>
  max_turns: number | null
  max_duration_ms: number | null
  deadline_at: string | null
  on_timeout: Generated<string>
  runtime_id: string | null
  pause: string | null
  owner_epoch: Generated<number>
  /** The newest snapshot the shipping bucket confirmed (migration 22); null: nothing shipped. */
  shipped_generation: number | null
  shipped_snapshot_id: string | null
  shipped_at: string | null
  /** That snapshot's chain link and tree digest (migration 23): what a restore is pinned to. */
  shipped_link_seq: number | null
  shipped_tree_digest: string | null
  /** The exclusive operation holding the session, the hold's token and until when (migration 24). */
  held_for: string | null
  held_by: string | null
  held_until: string | null
  held_swaps: number | null
  swap_count: Generated<number>
  /** When the session may next time out, never later than it will (migration 25); null: never. */
  next_due_at: string | null
  /** How long an approval request may wait (migration 33); null: no limit. */
  approval_timeout_ms: number | null
  /** The approval request whose answer the agent has not had yet (migration 33). */
  approval_id: string | null
}
