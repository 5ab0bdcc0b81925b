import { type Static, Type } from '@sinclair/typebox'
import { MAX_EXACT_INTEGER } from './common.js'
import { PersistedPathSchema } from './persist.js'
import { DiffSchema, SessionSchema } from './sessions.js'

/** Objects whose inner fields vary with the agent or the server version: documented open. */
const open = (description: string) => Type.Object({}, { additionalProperties: true, description })
const nullable = <T extends Parameters<typeof Type.Union>[0][number]>(schema: T) =>
  Type.Union([schema, Type.Null()])

/** A TTL in ms: null keeps (never coerced: a TTL of 0 deletes at the next pass). */
const ttl = (description: string) =>
  Type.Union([Type.Integer({ minimum: 0, maximum: MAX_EXACT_INTEGER }), Type.Null()], { description })

/** A tenant's retention policy, one TTL per layer; defaults and what each keeps: docs/retention.md. */
export const RetentionPolicySchema = Type.Object({
  keepAutoSnapshots: Type.Integer({ minimum: 1, maximum: 10_000 }),
  endedSnapshotTtlMs: ttl('Snapshots of ended sessions, counted from the end'),
  endedWorkspaceTtlMs: ttl('Workspaces of ended sessions (the session becomes deleted), from the end'),
  artifactTtlMs: ttl('Artifacts, counted from their promotion'),
  buildLogTtlMs: ttl(
    "Build logs of revisions other than an agent's current one, from the revision's creation",
  ),
  setupLogTtlMs: ttl("Setup and resume logs, from the phase's end (the phase's status and exit code stay)"),
  memoryVersionTtlMs: ttl("An agent memory's past versions, from their creation (the current one stays)"),
  networkLogTtlMs: ttl("Sessions' network log entries, from the decision"),
  sessionEventTtlMs: ttl("Sessions' status events, from the change (each session's latest one stays)"),
  turnEventTtlMs: ttl("A turn's stored stream events (to resume a dropped stream), from the turn's end"),
})

/** What retention deleted in one layer, over the tenant's life. */
const LayerFreedSchema = Type.Object({ deleted: Type.Integer(), bytesFreed: Type.Number() })

/** `GET /v1/usage`: what a tenant holds, and what retention freed. */
export const UsageSchema = Type.Object({
  sessions: Type.Object({
    total: Type.Integer(),
    byStatus: Type.Record(Type.String(), Type.Integer()),
  }),
  snapshots: Type.Integer(),
  pool: Type.Object({ totalBytes: Type.Number(), freeBytes: Type.Number() }),
  /** The storage limits in force and what this tenant's trees hold against them (exclusive bytes; null: unknown). */
  quota: Type.Object({
    enforced: Type.Boolean(),
    workspaceBytes: Type.Optional(Type.Number()),
    tenantBytes: Type.Optional(Type.Number()),
    reserveBytes: Type.Optional(Type.Number()),
    agentsTotalBytes: Type.Optional(Type.Number()),
    usedBytes: nullable(Type.Number()),
  }),
  retention: Type.Object({
    policy: RetentionPolicySchema,
    bytesFreed: Type.Number(),
    deletedSnapshots: Type.Integer(),
    deletedWorkspaces: Type.Integer(),
    /** Per layer (`snapshot`, `workspace`, `artifact`, `build_log`, `setup_log`, …: docs/retention.md). */
    layers: Type.Record(Type.String(), LayerFreedSchema),
  }),
  /** `pause: memory` checkpoints the tenant's sessions hold (in the data dir, beside the pool). */
  memoryCheckpoints: Type.Object({ count: Type.Integer(), bytes: Type.Number() }),
  /**
   * The tenant's artifacts (beside the pool, in the same tenant quota) and the space reserved for
   * artifact copies under way.
   */
  artifacts: Type.Object({ count: Type.Integer(), bytes: Type.Number(), reservedBytes: Type.Number() }),
  /**
   * The output logs of the tenant's commands on their nodes, in its storage budget: a running
   * command's counts at its bound (8 MiB), an ended one's at what it kept.
   */
  commandLogs: Type.Object({ count: Type.Integer(), bytes: Type.Number() }),
  /**
   * The distinct agent images the tenant's live revisions run on, and how many it may
   * (`--max-images-per-tenant`; images are shared, outside the tenant quota).
   */
  images: Type.Optional(Type.Object({ count: Type.Integer(), maxImages: Type.Integer() })),
  /** Only with `?storage=true` (else empty): the 100 most recently active sessions. */
  storage: Type.Array(
    Type.Object({ sessionId: Type.String(), referencedBytes: Type.Number(), exclusiveBytes: Type.Number() }),
  ),
})
export type Usage = Static<typeof UsageSchema>

/**
 * The agent's report of its last test run: `/workspace/.cairn/last-tests.json`, written by the agent
 * or its test command (a file that is not this shape is not reported).
 */
export const LastTestsSchema = Type.Object(
  {
    status: Type.Union([Type.Literal('passed'), Type.Literal('failed')]),
    passed: Type.Optional(Type.Integer({ minimum: 0 })),
    failed: Type.Optional(Type.Integer({ minimum: 0 })),
    skipped: Type.Optional(Type.Integer({ minimum: 0 })),
    command: Type.Optional(Type.String({ maxLength: 4096 })),
    at: Type.Optional(Type.String({ maxLength: 64 })),
  },
  { additionalProperties: false },
)
export type LastTests = Static<typeof LastTestsSchema>

/** `GET /v1/sessions/{id}/manifest`: everything that makes a session what it is, in one answer. */
export const SessionManifestSchema = Type.Object({
  session: SessionSchema,
  agent: Type.Object({ id: Type.String(), name: Type.String() }),
  revision: Type.Object({
    id: Type.String(),
    contentHash: nullable(Type.String()),
    envKey: nullable(Type.String()),
    command: Type.Array(Type.String()),
    protocol: Type.String(),
  }),
  baseImage: Type.String(),
  driver: Type.String(),
  storage: Type.String(),
  /** A hash of the revision's `setup:` and the session's setup command; null: neither. */
  setupVersion: nullable(Type.String()),
  sessionSetup: nullable(open('The session setup phase: status, attempts, exitCode, snapshotId, command')),
  generation: Type.Integer(),
  parentSessionId: nullable(Type.String()),
  forkedFromSnapshotId: nullable(Type.String()),
  snapshotIds: Type.Array(Type.String()),
  /** The newest snapshot of the workspace (the last of `snapshotIds`); null: none. */
  snapshotId: nullable(Type.String()),
  /** The agent memory's version mounted at /memory in new sandboxes (0: none written). */
  memoryVersion: Type.Integer(),
  /**
   * The git checkout at /workspace (read from `.git/HEAD` and its refs, no git run, no link
   * followed): its branch (null: detached) and commit; null when /workspace is not one.
   */
  repo: nullable(Type.Object({ branch: nullable(Type.String()), sha: nullable(Type.String()) })),
  /** The agent's report of its last test run (`/workspace/.cairn/last-tests.json`); null: none. */
  lastTests: nullable(LastTestsSchema),
  workspaceSizes: nullable(open('With sizes=true: the measured bytes of the live workspace')),
  lastTurn: nullable(
    Type.Object({
      id: Type.String(),
      turn: Type.Integer(),
      status: Type.String(),
      durationMs: nullable(Type.Number()),
      endedAt: nullable(Type.String()),
    }),
  ),
  dirtyFiles: nullable(Type.Omit(DiffSchema, ['from'])),
  /**
   * The directories outside /workspace the agent keeps (cairn.yaml's `persist:`): each as declared,
   * its path in the sandbox and where diffs, exports and file reads name it (`.cairn-persist/…`).
   */
  persist: Type.Array(PersistedPathSchema),
  limits: open('The revision manifest limits'),
  openPorts: Type.Array(Type.Integer()),
  policies: open('The session lifecycle policy, its deadline and how many automatic snapshots are kept'),
})
export type SessionManifest = Static<typeof SessionManifestSchema>
