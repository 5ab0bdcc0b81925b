import { type Static, Type } from '@sinclair/typebox'
import { NO_NUL_PATTERN } from './common.js'
import { PersistSchema } from './persist.js'

export const AGENT_PROTOCOLS = ['stdio', 'jsonl', 'exec', 'http'] as const
export type AgentProtocolName = (typeof AGENT_PROTOCOLS)[number]

export const REVISION_STATUSES = ['DEPLOYING', 'READY', 'FAILED'] as const
export type RevisionStatus = (typeof REVISION_STATUSES)[number]

export const AGENT_NAME_PATTERN = '^[a-z0-9][a-z0-9-]{0,62}$'

export const LimitsSchema = Type.Object(
  {
    memoryMiB: Type.Optional(Type.Integer({ minimum: 16, maximum: 65536 })),
    pids: Type.Optional(Type.Integer({ minimum: 8, maximum: 65536 })),
    cpus: Type.Optional(Type.Number({ minimum: 0.05, maximum: 256 })),
    turnTimeoutMs: Type.Optional(Type.Integer({ minimum: 100, maximum: 24 * 3600 * 1000 })),
  },
  { additionalProperties: false },
)
export type Limits = Static<typeof LimitsSchema>

/** Egress allowlist: `host`, `*.domain`, `host:port`, or `{host, methods}`. Default deny. */
export const NetworkPolicySchema = Type.Object(
  {
    allow: Type.Array(
      Type.Union([
        Type.String({ minLength: 1, maxLength: 253 }),
        Type.Object({
          host: Type.String({ minLength: 1, maxLength: 253 }),
          methods: Type.Optional(Type.Array(Type.String({ maxLength: 16 }))),
        }),
      ]),
      { maxItems: 256 },
    ),
  },
  { additionalProperties: false },
)
export type NetworkPolicy = Static<typeof NetworkPolicySchema>

/** A command: a string (run through `sh -c`) or the argv itself. */
const CommandSchema = Type.Union([
  Type.String({ minLength: 1, pattern: NO_NUL_PATTERN }),
  Type.Array(Type.String({ pattern: NO_NUL_PATTERN }), { minItems: 1 }),
])

/** Environment variables of a setup phase (cairn.yaml's `session.setup` and the API's `setup`). */
export const SetupEnvSchema = Type.Record(
  Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }),
  Type.String({ pattern: NO_NUL_PATTERN }),
)
/** How long a setup phase may run (cairn.yaml's `session.setup` and the API's `setup`). */
export const SetupTimeoutMsSchema = Type.Integer({ minimum: 1000, maximum: 6 * 3600 * 1000 })

/** A session phase of cairn.yaml (`session.setup`, `session.resume`): a command, or one with its settings. */
const SessionPhaseSchema = Type.Union([
  ...CommandSchema.anyOf,
  Type.Object(
    {
      command: CommandSchema,
      env: Type.Optional(SetupEnvSchema),
      network: Type.Optional(NetworkPolicySchema),
      timeoutMs: Type.Optional(SetupTimeoutMsSchema),
    },
    { additionalProperties: false },
  ),
])

/**
 * cairn.yaml's `http` (with `protocol: http`): the agent serves HTTP on `port` on the sandbox's
 * loopback, and each message is a `POST` to `path` (docs/agent-protocols.md "http").
 */
export const HttpAgentSchema = Type.Object(
  {
    port: Type.Integer({ minimum: 1, maximum: 65535 }),
    /** The request path of a message (default `/run`). */
    path: Type.Optional(Type.String({ pattern: '^/[!-~]*$', maxLength: 1024 })),
    /** How long a fresh sandbox may take to listen on the port (default 30 s). */
    readyTimeoutMs: Type.Optional(Type.Integer({ minimum: 100, maximum: 10 * 60 * 1000 })),
  },
  { additionalProperties: false },
)
export type HttpAgent = Static<typeof HttpAgentSchema>

export const PAUSE_POLICIES = ['stop', 'memory'] as const
export type PausePolicy = (typeof PAUSE_POLICIES)[number]

export const ISOLATION_NAMES = ['bwrap', 'gvisor'] as const
export const IsolationSchema = Type.Union(ISOLATION_NAMES.map((n) => Type.Literal(n)))

/**
 * `cairn.yaml` keys that are planned but not built: refused with what is planned, rather than as
 * unknown (a manifest written for a later release must not deploy as if they were honoured).
 */
export const PLANNED_MANIFEST_KEYS: Readonly<Record<string, string>> = {}

/** `cairn.yaml` as the server validates it: a key it does not name is refused (see unknown-keys.ts). */
export const AgentManifestSchema = Type.Object(
  {
    name: Type.String({ pattern: AGENT_NAME_PATTERN }),
    command: CommandSchema,
    protocol: Type.Optional(Type.Union(AGENT_PROTOCOLS.map((p) => Type.Literal(p)))),
    /** Where an `http` agent listens; required with `protocol: http`, refused with any other. */
    http: Type.Optional(HttpAgentSchema),
    limits: Type.Optional(LimitsSchema),
    secrets: Type.Optional(Type.Array(Type.String())),
    ignore: Type.Optional(Type.Array(Type.String())),
    network: Type.Optional(NetworkPolicySchema),
    /** Sandbox driver: `bwrap` (namespaces, default) or `gvisor` (a user-space kernel). */
    isolation: Type.Optional(IsolationSchema),
    /**
     * What happens to a session's sandbox when keep-warm ends: `stop` (default; the next message
     * starts it cold) or `memory` (checkpointed with its processes and memory, and restored by the
     * next message; needs a driver with `memorySnapshot`, see `GET /v1/runtime`).
     */
    pause: Type.Optional(Type.Union(PAUSE_POLICIES.map((p) => Type.Literal(p)))),
    /**
     * The sandbox's root: `debian:<suite>` (built from the operator's Debian mirror, with
     * `packages`), an OCI reference (`registry.example.com/team/base:1.4`, pulled), or `host` (the
     * host's /usr, read-only). Unset: the operator's default image. The root is writable and resets
     * with every new sandbox; only /workspace (and /memory, and the paths in `persist:`) persist.
     */
    image: Type.Optional(Type.String({ minLength: 1, maxLength: 512 })),
    /**
     * Directories outside /workspace kept with the session (`~/.claude`, `/var/cache/app`): `~` is
     * the agent's home, then /home/agent instead of /workspace. Kept in the workspace's subvolume,
     * so snapshots, restores, forks, exports, shipping and quotas take them (docs/persist.md).
     */
    persist: Type.Optional(PersistSchema),
    /** Debian packages installed into a `debian:<suite>` image when it is built. */
    packages: Type.Optional(
      Type.Array(Type.String({ minLength: 1, maxLength: 128 }), { maxItems: 256, uniqueItems: true }),
    ),
    /** Per-session settings; `session.setup` runs before each new session's first turn. */
    session: Type.Optional(
      Type.Object(
        {
          setup: Type.Optional(SessionPhaseSchema),
          /**
           * Maintenance run when a cold sandbox starts on a workspace a turn has run on, before
           * the agent (after keep-warm, a restart, a restore, on a fork): its log is kept as the
           * setup's; a failure fails the turn with `resume_failed` and runs again on the next one.
           */
          resume: Type.Optional(SessionPhaseSchema),
        },
        { additionalProperties: false },
      ),
    ),
    /** Command run once per revision after dependencies are installed (network allowed). */
    setup: Type.Optional(CommandSchema),
  },
  { additionalProperties: false },
)
export type AgentManifest = Static<typeof AgentManifestSchema>

export const RevisionSchema = Type.Object({
  id: Type.String(),
  agentId: Type.String(),
  status: Type.Union(REVISION_STATUSES.map((s) => Type.Literal(s))),
  contentHash: Type.String(),
  command: Type.Array(Type.String()),
  protocol: Type.String(),
  fileCount: Type.Integer(),
  sizeBytes: Type.Integer(),
  error: Type.Union([Type.String(), Type.Null()]),
  /** Content address of the dependency environment, when the project has dependencies. */
  envKey: Type.Union([Type.String(), Type.Null()]),
  /** Key of the image the revision's sandboxes run on (see `GET /v1/images`); null: the host's /usr. */
  imageKey: Type.Union([Type.String(), Type.Null()]),
  requiredSecrets: Type.Array(Type.String()),
  createdAt: Type.String(),
})
export type RevisionInfo = Static<typeof RevisionSchema>

export const AgentSchema = Type.Object({
  id: Type.String(),
  name: Type.String(),
  currentRevisionId: Type.Union([Type.String(), Type.Null()]),
  command: Type.Array(Type.String()),
  protocol: Type.String(),
  createdAt: Type.String(),
  updatedAt: Type.String(),
})
export type AgentInfo = Static<typeof AgentSchema>

export const AgentDetailSchema = Type.Intersect([
  AgentSchema,
  Type.Object({ revisions: Type.Array(RevisionSchema) }),
])
export type AgentDetail = Static<typeof AgentDetailSchema>

export const DeployResultSchema = Type.Object({ agent: AgentSchema, revision: RevisionSchema })
export type DeployResult = Static<typeof DeployResultSchema>

export const AgentListSchema = Type.Object({ data: Type.Array(AgentSchema) })

/** A revision's build log so far (`error` once the build failed). */
export const BuildLogSchema = Type.Object({
  status: Type.String(),
  error: Type.Union([Type.String(), Type.Null()]),
  lines: Type.Array(Type.String()),
})

/**
 * A file promoted out of a workspace into the agent's artifact store (kept after its session is
 * deleted). Its `sizeBytes` count in the tenant's storage quota until it is deleted.
 */
export const ArtifactSchema = Type.Object({
  id: Type.String(),
  agentId: Type.String(),
  sessionId: Type.String(),
  path: Type.String(),
  sizeBytes: Type.Integer(),
  sha256: Type.String(),
  createdAt: Type.String(),
})
export type Artifact = Static<typeof ArtifactSchema>

export const ArtifactListSchema = Type.Object({ data: Type.Array(ArtifactSchema) })
