import { type Static, Type } from '@sinclair/typebox'
import { NetworkPolicySchema, PAUSE_POLICIES, SetupEnvSchema, SetupTimeoutMsSchema } from './agents.js'
import { MAX_EXACT_INTEGER, NO_NUL_PATTERN } from './common.js'
import { SESSION_STATUSES } from './names.js'

export const SessionStatusSchema = Type.Union(SESSION_STATUSES.map((s) => Type.Literal(s)))

/** Why a status changed. Every transition records one of these. */
export const STATUS_CAUSES = [
  'created',
  /**
   * `pause: memory`: the sandbox was checkpointed when keep-warm ended, or for a snapshot with
   * memory (detail: bytes, time).
   */
  'memory_paused',
  /** The next message restored it instead of a cold start (a fork's: detail names the snapshot). */
  'memory_restored',
  /**
   * A checkpoint was not used or not kept (the workspace changed since, a failed restore, over the
   * storage quota): detail says why.
   */
  'memory_discarded',
  'turn_started',
  'turn_completed',
  'turn_failed',
  'turn_cancelled',
  'agent_crash',
  'agent_exit',
  'memory_limit',
  'pids_limit',
  'output_limit',
  'protocol_error',
  'turn_timeout',
  'idle_timeout',
  'user_end',
  'user_resume',
  'user_delete',
  'server_restart',
  'state_lost',
  'server_shutdown',
  'retention',
  'ephemeral_end',
  'forked',
  'workspace_restored',
  'workspace_imported',
  /** A fork's changes were merged in: detail names the fork, its snapshot, the base and the undo snapshot. */
  'workspace_merged',
  'setup_failed',
  /** The `session.resume` command failed before a cold start: the next message runs it again. */
  'resume_failed',
  'max_turns',
  'max_duration',
  'storage_error',
  'quota_exceeded',
  'policy_changed',
  /** A command started in the session's sandbox outside a turn (detail: its id and argv). */
  'command_started',
  /** A command of the session ended (detail: its id, how it ended). */
  'command_ended',
  /**
   * The session's node was declared lost (lease ended, process gone): its running turn failed
   * with `node_lost`; it resumes when the node registers again.
   */
  'node_lost',
  /** The session was moved to another node (drain, `cairn sessions move`); the detail says from → to. */
  'moved',
  /**
   * The session's node was lost and the session came back on another node from the shipping
   * bucket: detail names the snapshot it was restored from and every turn whose workspace changes
   * did not make it (never a silent rollback).
   */
  'node_recovered',
  /**
   * The API replica relaying the session's turn died (its lease ended, or it started again): the
   * turn failed with `replica_lost`, its agent told to stop; the next message resumes the session.
   */
  'replica_lost',
  /** The API replica relaying the turn stopped (its shutdown grace ran out): the turn failed with `replica_stopping`. */
  'replica_stopping',
] as const
export type StatusCause = (typeof STATUS_CAUSES)[number]

export const TURN_STATUSES = ['running', 'completed', 'failed', 'cancelled', 'interrupted'] as const
export type TurnStatus = (typeof TURN_STATUSES)[number]

export const DEFAULT_IDLE_TIMEOUT_MS = 30 * 24 * 60 * 60 * 1000
export const DEFAULT_KEEP_WARM_MS = 5 * 60 * 1000
export const MAX_PROMPT_BYTES = 1024 * 1024
export const MAX_IDLE_TIMEOUT_MS = 365 * 24 * 3600 * 1000
export const MAX_KEEP_WARM_MS = 24 * 3600 * 1000

export const ON_TIMEOUT_ACTIONS = ['keep', 'destroy'] as const
export type OnTimeoutAction = (typeof ON_TIMEOUT_ACTIONS)[number]

/**
 * A session's lifecycle policy as a request gives it: every field optional. On create, what is
 * left out takes the server default; on fork, the parent's value; on resume and restore, the
 * session's current value. `null` removes a limit.
 */
export const SessionPolicyInput = Type.Object(
  {
    idleTimeoutMs: Type.Optional(
      Type.Integer({
        minimum: 1000,
        maximum: MAX_IDLE_TIMEOUT_MS,
        description: 'idle this long (no turn, stream, file call or lease) → status timeout',
      }),
    ),
    keepWarmMs: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_KEEP_WARM_MS,
        description: 'how long the sandbox stays warm after a turn',
      }),
    ),
    maxTurns: Type.Optional(
      Type.Union([Type.Integer({ minimum: 1, maximum: 1_000_000 }), Type.Null()], {
        description: 'the session ends (cause max_turns) after this many turns; null: no limit',
      }),
    ),
    maxDurationMs: Type.Optional(
      Type.Union([Type.Integer({ minimum: 1000, maximum: MAX_IDLE_TIMEOUT_MS }), Type.Null()], {
        description:
          'wall-clock life from creation or the last resume; past it → status timeout (cause max_duration); null: no limit',
      }),
    ),
    onTimeout: Type.Optional(
      Type.Union(
        ON_TIMEOUT_ACTIONS.map((a) => Type.Literal(a)),
        { description: 'keep (default): the workspace stays, resumable; destroy: deleted at the timeout' },
      ),
    ),
    approvalTimeoutMs: Type.Optional(
      Type.Union([Type.Integer({ minimum: 1000, maximum: MAX_IDLE_TIMEOUT_MS }), Type.Null()], {
        description:
          "an agent's approval request left unanswered this long → status expired (docs/approvals.md); null (default): it waits",
      }),
    ),
  },
  { additionalProperties: false },
)
export type SessionPolicyInput = Static<typeof SessionPolicyInput>

/** The policy in force for a session: every field resolved, stored with the session. */
export const SessionPolicySchema = Type.Object({
  idleTimeoutMs: Type.Integer(),
  keepWarmMs: Type.Integer(),
  maxTurns: Type.Union([Type.Integer(), Type.Null()]),
  maxDurationMs: Type.Union([Type.Integer(), Type.Null()]),
  onTimeout: Type.Union(ON_TIMEOUT_ACTIONS.map((a) => Type.Literal(a))),
  approvalTimeoutMs: Type.Union([Type.Integer(), Type.Null()]),
})
export type SessionPolicy = Static<typeof SessionPolicySchema>

/**
 * A per-session setup phase: run once before the first turn in the session's sandbox, with the
 * agent's `setup`-scoped secrets and its own network policy; the agent phase gets neither.
 */
export const SessionSetupSchema = Type.Object(
  {
    /** A string runs through `sh -c`; an array is the argv itself. */
    command: Type.Union([
      Type.String({ minLength: 1, maxLength: 16_384, pattern: NO_NUL_PATTERN }),
      Type.Array(Type.String({ maxLength: 16_384, pattern: NO_NUL_PATTERN }), { minItems: 1, maxItems: 256 }),
    ]),
    env: Type.Optional(SetupEnvSchema),
    /** Egress of the setup phase (default: the session's policy). */
    network: Type.Optional(NetworkPolicySchema),
    timeoutMs: Type.Optional(SetupTimeoutMsSchema),
  },
  { additionalProperties: false },
)
export type SessionSetup = Static<typeof SessionSetupSchema>

export const SETUP_STATUSES = ['pending', 'running', 'succeeded', 'failed'] as const
export type SetupStatus = (typeof SETUP_STATUSES)[number]

export const SetupInfoSchema = Type.Object({
  sessionId: Type.String(),
  status: Type.Union(SETUP_STATUSES.map((s) => Type.Literal(s))),
  command: Type.Array(Type.String()),
  attempts: Type.Integer(),
  exitCode: Type.Union([Type.Integer(), Type.Null()]),
  error: Type.Union([Type.String(), Type.Null()]),
  startedAt: Type.Union([Type.String(), Type.Null()]),
  endedAt: Type.Union([Type.String(), Type.Null()]),
  /** The automatic snapshot taken once setup succeeded. */
  snapshotId: Type.Union([Type.String(), Type.Null()]),
  /** The last lines of the log (`…/setup/log` has all of it, up to 1 MiB). */
  logTail: Type.String(),
})
export type SetupInfo = Static<typeof SetupInfoSchema>

/** The latest run of the session's `session.resume` command (`GET /v1/sessions/{id}/resume-phase`). */
export const ResumeInfoSchema = Type.Object({
  sessionId: Type.String(),
  status: Type.Union([Type.Literal('running'), Type.Literal('succeeded'), Type.Literal('failed')]),
  command: Type.Array(Type.String()),
  /** How many times it ran (once per cold start on an existing workspace). */
  runs: Type.Integer(),
  exitCode: Type.Union([Type.Integer(), Type.Null()]),
  error: Type.Union([Type.String(), Type.Null()]),
  startedAt: Type.Union([Type.String(), Type.Null()]),
  endedAt: Type.Union([Type.String(), Type.Null()]),
  /** The last lines of the latest run's log (`…/resume-phase/log` has all of it, up to 1 MiB). */
  logTail: Type.String(),
})
export type ResumeInfo = Static<typeof ResumeInfoSchema>

export const CreateSessionBody = Type.Object(
  {
    agent: Type.String({ minLength: 1, maxLength: 200, description: 'Agent ID or name' }),
    title: Type.Optional(Type.String({ maxLength: 200 })),
    idleTimeoutMs: Type.Optional(
      Type.Integer({
        minimum: 1000,
        maximum: MAX_IDLE_TIMEOUT_MS,
        description: 'same as policy.idleTimeoutMs',
      }),
    ),
    keepWarmMs: Type.Optional(
      Type.Integer({ minimum: 0, maximum: MAX_KEEP_WARM_MS, description: 'same as policy.keepWarmMs' }),
    ),
    policy: Type.Optional(SessionPolicyInput),
    network: Type.Optional(NetworkPolicySchema),
    ephemeral: Type.Optional(
      Type.Boolean({ description: 'delete the workspace and its snapshots when the session ends' }),
    ),
    keepTranscript: Type.Optional(
      Type.Boolean({ description: 'with ephemeral: keep the transcript after the end' }),
    ),
    autoSnapshots: Type.Optional(
      Type.Boolean({
        description: 'snapshot the workspace after every turn so it can be undone (default true)',
      }),
    ),
    setup: Type.Optional(SessionSetupSchema),
    pause: Type.Optional(
      Type.Union(
        PAUSE_POLICIES.map((p) => Type.Literal(p)),
        {
          description:
            "what this session's sandbox becomes when keep-warm ends, over the agent's cairn.yaml `pause`: memory (checkpointed, restored at the next message) or stop",
        },
      ),
    ),
  },
  { additionalProperties: false },
)
export type CreateSessionBody = Static<typeof CreateSessionBody>

export const ResumeBody = Type.Object(
  { policy: Type.Optional(SessionPolicyInput) },
  { additionalProperties: false },
)
export type ResumeBody = Static<typeof ResumeBody>

export const SendMessageBody = Type.Object(
  { prompt: Type.String({ minLength: 1, maxLength: MAX_PROMPT_BYTES }) },
  { additionalProperties: false },
)
export type SendMessageBody = Static<typeof SendMessageBody>

/**
 * `POST /v1/messages`: a message to an agent, in `sessionId` or, without it, in a session created
 * for it (with the options of `POST /v1/sessions`), as hosted agent-session products do.
 */
export const AgentMessageBody = Type.Object(
  {
    ...CreateSessionBody.properties,
    prompt: SendMessageBody.properties.prompt,
    sessionId: Type.Optional(
      Type.String({ minLength: 1, maxLength: 64, description: 'an existing session of the agent (full ID)' }),
    ),
  },
  { additionalProperties: false },
)
export type AgentMessageBody = Static<typeof AgentMessageBody>

export const SessionSchema = Type.Object({
  id: Type.String(),
  agentId: Type.String(),
  agentName: Type.String(),
  revisionId: Type.String(),
  title: Type.Union([Type.String(), Type.Null()]),
  status: SessionStatusSchema,
  statusCause: Type.String(),
  turnCount: Type.Integer(),
  messageCount: Type.Integer(),
  idleTimeoutMs: Type.Integer(),
  keepWarmMs: Type.Integer(),
  policy: SessionPolicySchema,
  /** When maxDurationMs runs out (null: no limit). */
  deadlineAt: Type.Union([Type.String(), Type.Null()]),
  /** Workspace generation: moves forward whenever the workspace may have changed. */
  generation: Type.Integer(),
  autoSnapshots: Type.Boolean(),
  ephemeral: Type.Boolean(),
  /** The session's own `pause` (POST /v1/sessions); null: the agent's cairn.yaml decides. */
  pause: Type.Union([...PAUSE_POLICIES.map((p) => Type.Literal(p)), Type.Null()]),
  warm: Type.Boolean(),
  /** The agent's approval request whose answer it has not had yet (human review); null: none. */
  approvalId: Type.Union([Type.String(), Type.Null()]),
  createdAt: Type.String(),
  updatedAt: Type.String(),
  lastActiveAt: Type.String(),
})
export type SessionInfo = Static<typeof SessionSchema>

export const SessionListSchema = Type.Object({
  data: Type.Array(SessionSchema),
  nextCursor: Type.Union([Type.String(), Type.Null()]),
})
export type SessionList = Static<typeof SessionListSchema>

export const ListSessionsQuery = Type.Object(
  {
    agent: Type.Optional(Type.String()),
    status: Type.Optional(SessionStatusSchema),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 500 })),
    cursor: Type.Optional(Type.String()),
  },
  { additionalProperties: false },
)
export type ListSessionsQuery = Static<typeof ListSessionsQuery>

export const MessageSchema = Type.Object({
  role: Type.Union([Type.Literal('user'), Type.Literal('assistant')]),
  content: Type.String(),
  turnId: Type.String(),
  turn: Type.Integer(),
  status: Type.Optional(Type.String()),
  createdAt: Type.String(),
})
export type Message = Static<typeof MessageSchema>

export const MessageListSchema = Type.Object({ data: Type.Array(MessageSchema) })

export const StatusEventSchema = Type.Object({
  id: Type.String(),
  from: Type.Union([Type.String(), Type.Null()]),
  to: Type.String(),
  cause: Type.String(),
  detail: Type.Union([Type.String(), Type.Null()]),
  at: Type.String(),
})
export type StatusEvent = Static<typeof StatusEventSchema>

export const TurnSchema = Type.Object({
  id: Type.String(),
  seq: Type.Integer(),
  status: Type.String(),
  prompt: Type.String(),
  response: Type.String(),
  stderrTail: Type.String(),
  sandboxId: Type.Union([Type.String(), Type.Null()]),
  startedAt: Type.String(),
  endedAt: Type.Union([Type.String(), Type.Null()]),
  durationMs: Type.Union([Type.Integer(), Type.Null()]),
})
export type TurnInfo = Static<typeof TurnSchema>

export const SNAPSHOT_REASONS = [
  'before_turn',
  'after_setup',
  'at_end',
  'manual',
  'before_restore',
  'before_import',
  'before_merge',
  /** The workspace as it was when the agent asked for approval (human review). */
  'review',
] as const
export type SnapshotReason = (typeof SNAPSHOT_REASONS)[number]

/**
 * Bytes a workspace tree uses: referenced (all its data) and exclusive (data no other tree
 * shares: what deleting it alone would free). Measured when asked for, never stored: exclusive
 * grows when the workspace or a sibling snapshot stops sharing data with this tree.
 */
export const TreeSizesSchema = Type.Object({
  referencedBytes: Type.Integer({ minimum: 0 }),
  exclusiveBytes: Type.Integer({ minimum: 0 }),
})
export type TreeSizes = Static<typeof TreeSizesSchema>

export const SnapshotSchema = Type.Object({
  id: Type.String(),
  sessionId: Type.String(),
  kind: Type.Union([Type.Literal('auto'), Type.Literal('manual')]),
  reason: Type.String(),
  label: Type.Union([Type.String(), Type.Null()]),
  /** The turn this snapshot follows (0: before the first turn). */
  turn: Type.Integer(),
  /**
   * The last turn whose end state this snapshot also is: the turns after `turn` up to this one
   * changed nothing in the workspace, so no snapshot was taken for them (equal to `turn` otherwise).
   * Restore, undo and fork by any turn in `turn…throughTurn` use this snapshot.
   */
  throughTurn: Type.Integer(),
  generation: Type.Integer(),
  /** SHA-256 content digest of the tree (`sha256:…`); null until asked for with `digest=true`. */
  digest: Type.Union([Type.String(), Type.Null()]),
  /** Bytes the snapshot uses; null unless asked for with `sizes=true` (measured on each request). */
  sizes: Type.Union([TreeSizesSchema, Type.Null()]),
  createdAt: Type.String(),
})
export type SnapshotInfo = Static<typeof SnapshotSchema>

export const CreateSnapshotBody = Type.Object(
  {
    label: Type.Optional(Type.String({ maxLength: 200 })),
    /**
     * Also keep the memory of the session's running sandbox (drivers with `memorySnapshot`, a
     * `pause: memory` session): a fork from this snapshot starts from that running state. The
     * session itself goes on where it was (its sandbox is restored on its next message).
     */
    memory: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: false },
)

/**
 * The snapshot a restore or fork starts from: `snapshotId`, or `turn` (the automatic snapshot
 * after that turn); with both, `snapshotId`. Said in the schema (anyOf), so the document states
 * the rule and the validator enforces it.
 */
const SNAPSHOT_OR_TURN = {
  anyOf: [{ required: ['snapshotId'] }, { required: ['turn'] }],
  description: 'Give snapshotId, or turn (the snapshot after that turn); with both, snapshotId is used.',
}

export const RestoreBody = Type.Object(
  {
    snapshotId: Type.Optional(Type.String({ maxLength: 64 })),
    turn: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_EXACT_INTEGER })),
    policy: Type.Optional(SessionPolicyInput),
  },
  { additionalProperties: false, ...SNAPSHOT_OR_TURN },
)
export type RestoreBody = Static<typeof RestoreBody>

export const ForkBody = Type.Object(
  {
    snapshotId: Type.Optional(Type.String({ maxLength: 64 })),
    turn: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_EXACT_INTEGER })),
    title: Type.Optional(Type.String({ maxLength: 200 })),
    policy: Type.Optional(SessionPolicyInput),
  },
  { additionalProperties: false, ...SNAPSHOT_OR_TURN },
)
export type ForkBody = Static<typeof ForkBody>

/** The most forks one `POST /v1/sessions/{id}/forks` makes. */
export const MAX_FORKS_PER_REQUEST = 16

/**
 * Forks of the session as it is now (`POST /v1/sessions/{id}/forks`): one snapshot is taken and
 * `count` sessions start from it. With `memory: true` the snapshot also keeps the memory of the
 * session's running (or paused) sandbox, taken at the same instant as its files, and each fork's
 * first message restores it: its processes go on from that instant.
 */
export const ForksBody = Type.Object(
  {
    memory: Type.Optional(
      Type.Boolean({
        description:
          "keep the running sandbox's memory too (drivers with memorySnapshot, a pause: memory session); default false",
      }),
    ),
    count: Type.Optional(
      Type.Integer({ minimum: 1, maximum: MAX_FORKS_PER_REQUEST, description: 'how many forks (default 1)' }),
    ),
    title: Type.Optional(Type.String({ maxLength: 200 })),
    /** The label of the snapshot the forks start from. */
    label: Type.Optional(Type.String({ maxLength: 200 })),
    policy: Type.Optional(SessionPolicyInput),
  },
  { additionalProperties: false },
)
export type ForksBody = Static<typeof ForksBody>

export const ForksResultSchema = Type.Object({
  /** The parent's snapshot every fork starts from (its fork point for merges). */
  snapshot: SnapshotSchema,
  /** Whether the forks start from the parent's running state (their first message restores it). */
  memory: Type.Boolean(),
  sessions: Type.Array(SessionSchema),
})
export type ForksResult = Static<typeof ForksResultSchema>

/**
 * Names are bytes. A name, path or link target that is valid UTF-8 is carried as is; one that is
 * not is carried exactly as base64 of its bytes in the `…Base64` field beside it (the plain field
 * then holds a lossy rendering, for display only). Requests name such a path with `pathBase64`.
 */
export const FileEntrySchema = Type.Object({
  name: Type.String(),
  path: Type.String(),
  type: Type.Union([
    Type.Literal('file'),
    Type.Literal('directory'),
    Type.Literal('symlink'),
    Type.Literal('other'),
  ]),
  size: Type.Integer(),
  mode: Type.Integer(),
  modifiedAt: Type.String(),
  target: Type.Optional(Type.String()),
  /** The name's exact bytes, base64, when they are not UTF-8. */
  nameBase64: Type.Optional(Type.String()),
  pathBase64: Type.Optional(Type.String()),
  targetBase64: Type.Optional(Type.String()),
})
export type FileEntry = Static<typeof FileEntrySchema>

/**
 * The file or directory of a workspace, or of one of its snapshots, that a request names. A
 * parameter with a default is optional (Type.Optional): without it, the document would mark it
 * required while the validator fills the default in.
 */
export const WorkspacePathQuery = Type.Object({
  path: Type.Optional(Type.String({ default: '', maxLength: 4096 })),
  /** The path's exact bytes, base64 (for names that are not UTF-8); overrides `path`. */
  pathBase64: Type.Optional(Type.String({ maxLength: 8192, pattern: '^[A-Za-z0-9+/]*={0,2}$' })),
  snapshot: Type.Optional(Type.String({ maxLength: 64 })),
})

/** What a diff compares the workspace with: `revision` (the default) or a snapshot's ID. */
export const DiffQuery = Type.Object({ from: Type.Optional(Type.String()) })

export const DiffSchema = Type.Object({
  from: Type.String(),
  added: Type.Array(Type.String()),
  changed: Type.Array(Type.String()),
  deleted: Type.Array(Type.String()),
  truncated: Type.Boolean(),
  /**
   * Paths that are not UTF-8, as base64 of their exact bytes (they are not in the lists above);
   * absent when there are none.
   */
  bytePaths: Type.Optional(
    Type.Object({
      added: Type.Array(Type.String()),
      changed: Type.Array(Type.String()),
      deleted: Type.Array(Type.String()),
    }),
  ),
})
export type WorkspaceDiff = Static<typeof DiffSchema>

export const NetworkEventSchema = Type.Object({
  at: Type.String(),
  host: Type.String(),
  port: Type.Integer(),
  method: Type.String(),
  allowed: Type.Boolean(),
  reason: Type.String(),
  address: Type.Union([Type.String(), Type.Null()]),
})
export type NetworkEventInfo = Static<typeof NetworkEventSchema>

/** A lease: the session counts as active (no idle timeout, a warm sandbox stays warm) until `leaseUntil`. */
export const SessionLeaseSchema = Type.Object({ sessionId: Type.String(), leaseUntil: Type.String() })

/** A signed URL to a service on a port inside a session's sandbox (a preview), and when it expires. */
export const PreviewUrlSchema = Type.Object({ url: Type.String(), expiresAt: Type.String() })
