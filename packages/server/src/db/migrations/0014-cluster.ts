import type { Migration } from './migration.js'

/** Migrations 14–25. Sharing and the cluster: reused snapshots, previews, one running turn per session, files in the database, owners and nodes, shipping, holds. */
export const MIGRATIONS_0014: readonly Migration[] = [
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
]
