import { AGENT_PROTOCOLS, ApprovalAnswerSchema, COMMAND_SIGNALS, HttpAgentSchema } from '@cairn/protocol'
import { type TSchema, Type } from '@sinclair/typebox'
import { ISOLATIONS } from '../../sandbox/driver.js'
import { POOL_AREAS } from '../../storage/pool.js'

/**
 * The shapes of what an API replica may send a node (the node is a trust boundary even behind
 * mutual TLS): IDs and keys that name trees on the node's disk are plain names, never paths.
 */
const literals = (values: readonly string[]) => Type.Union(values.map((v) => Type.Literal(v)))
const optional = <T extends TSchema>(schema: T) => Type.Optional(schema)

/** A session, snapshot, revision, tenant or sandbox ID, or a staging tree's name. */
export const Id = Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$' })
/** A content key (an image's `sha256:…`, a dependency environment's). */
export const Key = Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$' })
const Count = Type.Integer({ minimum: 0 })
/** A path below a tree's root: relative, no `..` component (a stat must not leave the tree). */
export const RelPath = Type.String({ maxLength: 4096, pattern: '^(?!/)(?!(.*/)?\\.\\.(/|$))' })
const Strings = Type.Array(Type.String())
const Env = Type.Record(Type.String(), Type.String())
export const IsolationName = literals(ISOLATIONS)
export const PoolArea = literals(POOL_AREAS)

export const TreeRef = Type.Union([
  Type.Object({ sessionId: Id }, { additionalProperties: false }),
  Type.Object({ snapshotId: Id }, { additionalProperties: false }),
  Type.Object({ revisionId: Id }, { additionalProperties: false }),
  Type.Object({ stagedRevisionId: Id }, { additionalProperties: false }),
])

/** The chain link a bucket restore is pinned to (`RuntimePort.restoreFromBucket`). */
export const ShippedHead = Type.Object(
  { seq: Count, treeDigest: Type.String({ pattern: '^sha256:[0-9a-f]{64}$' }) },
  { additionalProperties: false },
)

const Limits = Type.Object({ memoryMiB: Type.Number(), pids: Type.Number(), cpus: Type.Number() })
const EgressRule = Type.Union([
  Type.String(),
  Type.Object({ host: Type.String(), methods: optional(Strings) }, { additionalProperties: false }),
])
const EgressPolicy = Type.Object({ allow: Type.Array(EgressRule) }, { additionalProperties: false })

export const TerminalSize = Type.Object(
  { rows: Type.Integer({ minimum: 1, maximum: 1000 }), cols: Type.Integer({ minimum: 1, maximum: 1000 }) },
  { additionalProperties: false },
)

/** A command to start beside a session's agent (`RuntimePort.startCommand`). */
export const CommandStart = Type.Object(
  {
    sessionId: Id,
    commandId: Id,
    command: Type.Array(Type.String(), { minItems: 1 }),
    env: optional(Env),
    cwd: Type.String({ maxLength: 4200, pattern: '^/workspace(/(?!\\.\\.(/|$))[^/]+)*$' }),
    timeoutMs: Type.Integer({ minimum: 1 }),
    maxOutputBytes: Type.Integer({ minimum: 1 }),
    stdin: Type.Boolean(),
    tty: optional(TerminalSize),
    keepWarmMs: Count,
    redact: optional(Type.Record(Type.String(), Type.String())),
  },
  { additionalProperties: false },
)
export const CommandSignal = literals(COMMAND_SIGNALS)
export const CommandReadRequest = Type.Object(
  {
    sessionId: Id,
    commandId: Id,
    offset: Count,
    maxBytes: Count,
    waitMs: Type.Integer({ minimum: 0, maximum: 60_000 }),
  },
  { additionalProperties: false },
)

export const Admission = Type.Object(
  { sessionId: Id, tenantId: Id, maxSandboxesPerTenant: Count, busy: Type.Array(Id) },
  { additionalProperties: false },
)

/** Persisted sandbox paths, as resolved by the server (see `resolvePersistPaths`). */
const PersistPaths = Type.Array(Type.String({ pattern: '^/', maxLength: 512 }), { maxItems: 16 })

export const AgentSpec = Type.Object(
  {
    sessionId: Id,
    tenantId: Id,
    command: Type.Array(Type.String(), { minItems: 1 }),
    protocol: literals(AGENT_PROTOCOLS),
    http: optional(HttpAgentSchema),
    env: Env,
    limits: Limits,
    turnTimeoutMs: Count,
    isolation: optional(IsolationName),
    egress: optional(
      Type.Object(
        {
          policy: EgressPolicy,
          secrets: optional(
            Type.Array(
              Type.Object(
                {
                  name: Type.String(),
                  standIn: Type.String(),
                  value: Type.String(),
                  hosts: Strings,
                  headers: optional(Strings),
                },
                { additionalProperties: false },
              ),
            ),
          ),
          upstreamCaPems: optional(Strings),
        },
        { additionalProperties: false },
      ),
    ),
    maxOutputChars: optional(Count),
    dependencyEnvKey: optional(Key),
    imageKey: optional(Key),
    memoryAgentId: optional(Id),
    persist: optional(PersistPaths),
    pause: optional(Type.Object({ generation: Count }, { additionalProperties: false })),
  },
  { additionalProperties: false },
)

export const TurnInput = Type.Object(
  {
    prompt: Type.String(),
    turn: Count,
    turnId: Id,
    transcript: Type.Array(Type.Record(Type.String(), Type.Unknown())),
    approval: Type.Optional(ApprovalAnswerSchema),
    /** `transcript` holds the lines after these, which the node was sent before (see transcript-wire.ts). */
    transcriptFrom: Type.Optional(
      Type.Object(
        { lines: Type.Integer({ minimum: 1 }), digest: Type.String({ maxLength: 64 }) },
        { additionalProperties: false },
      ),
    ),
  },
  { additionalProperties: false },
)

export const WorkspaceMark = Type.Object(
  { sandboxId: Id, ctransid: Count, writtenBytes: Count },
  { additionalProperties: false },
)

export const TurnOptions = Type.Object(
  { resume: optional(Type.Boolean()), keepWarmMs: optional(Count), mark: optional(WorkspaceMark) },
  { additionalProperties: false },
)

export const WorkspaceCommand = Type.Object(
  {
    sessionId: Id,
    command: Type.Array(Type.String(), { minItems: 1 }),
    env: Env,
    limits: Limits,
    timeoutMs: Count,
    imageKey: optional(Key),
    dependencyEnvKey: optional(Key),
    isolation: optional(IsolationName),
    egress: optional(Type.Object({ policy: EgressPolicy }, { additionalProperties: false })),
    persist: optional(PersistPaths),
  },
  { additionalProperties: false },
)

export const RevisionBuild = Type.Object(
  {
    revisionId: Id,
    tenantId: Id,
    imageKey: optional(Key),
    dependencies: optional(
      Type.Object(
        { envKey: Key, files: Strings, readsProject: Type.Boolean(), command: Strings },
        { additionalProperties: false },
      ),
    ),
    setup: optional(Strings),
    env: Env,
    egressAllow: Type.Array(EgressRule),
    isolation: optional(IsolationName),
    timeoutMs: Count,
  },
  { additionalProperties: false },
)

export const ImageRecipe = Type.Union([
  Type.Object({ kind: Type.Literal('host') }, { additionalProperties: false }),
  Type.Object(
    { kind: Type.Literal('debian'), suite: Type.String(), packages: Strings, mirror: Type.String() },
    { additionalProperties: false },
  ),
  Type.Object({ kind: Type.Literal('oci'), reference: Type.String() }, { additionalProperties: false }),
])

/** A tree shipped whole from one node to another (a revision, a dependency environment). */
export const ShippedTree = Type.Union([
  Type.Object({ revisionId: Id }, { additionalProperties: false }),
  Type.Object({ dependencyEnvKey: Key }, { additionalProperties: false }),
])

/** `snapshotWorkspace`'s options. */
export const SnapshotOptions = Type.Object(
  { ship: Type.Optional(Type.Boolean()) },
  { additionalProperties: false },
)

/** An image build's context on the wire: its timeout (its `log` lines come back as frames). */
export const BuildContext = Type.Object({ timeoutMs: Count }, { additionalProperties: false })

/** A tree read's options on the wire (its `signal` is the call's stream being reset). */
export const ReadOptions = Type.Object(
  { timeoutMs: optional(Count), background: optional(Type.Boolean()), subject: optional(Type.String()) },
  { additionalProperties: false },
)
