import { AGENT_PROTOCOLS } from '@cairn/protocol'
import { type Static, Type } from '@sinclair/typebox'

/**
 * The wire shapes of the hosted agent-session API (agent era) that its own SDK and CLI speak:
 * snake_case fields, list envelopes named after what they hold, errors with a top-level `detail`.
 * Cairn answers them under the compat prefix (see docs/compat.md); `/v1` keeps Cairn's own shapes.
 */

export const CompatErrorSchema = Type.Object({
  detail: Type.String({ description: 'what went wrong (read first by their CLI)' }),
  message: Type.String({ description: 'the same text (read by clients that look for message)' }),
  code: Type.String({ description: "Cairn's error code from the registry" }),
  request_id: Type.String(),
  details: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
})
export type CompatError = Static<typeof CompatErrorSchema>

export const CompatAgentSchema = Type.Object({
  id: Type.String(),
  name: Type.String(),
  command: Type.Union([Type.String(), Type.Null()]),
  environment_keys: Type.Array(Type.String()),
  required_secrets: Type.Array(Type.String()),
  deps_status: Type.Union([Type.Literal('building'), Type.Literal('ready'), Type.Literal('failed')]),
  deps_error: Type.Union([Type.String(), Type.Null()]),
  created_at: Type.String(),
  updated_at: Type.String(),
})
export type CompatAgent = Static<typeof CompatAgentSchema>

export const CompatAgentListSchema = Type.Object({ agents: Type.Array(CompatAgentSchema) })

/** Their statuses: Cairn's `completed` (ended by the user or a limit) is their `ended`. */
export const COMPAT_SESSION_STATUSES = ['active', 'idle', 'ended', 'failed', 'timeout', 'deleted'] as const
export type CompatSessionStatus = (typeof COMPAT_SESSION_STATUSES)[number]

export const CompatSessionSchema = Type.Object({
  id: Type.String(),
  agent_id: Type.String(),
  agent_name: Type.String(),
  status: Type.Union(COMPAT_SESSION_STATUSES.map((s) => Type.Literal(s))),
  title: Type.Union([Type.String(), Type.Null()]),
  message_count: Type.Integer(),
  idle_timeout_seconds: Type.Integer(),
  created_at: Type.String({ description: 'ISO 8601, UTC' }),
  last_activity_at: Type.String({ description: 'ISO 8601, UTC' }),
})
export type CompatSession = Static<typeof CompatSessionSchema>

export const CompatSessionListSchema = Type.Object({ sessions: Type.Array(CompatSessionSchema) })

export const CompatCreateSessionBody = Type.Object(
  {
    agent_id: Type.String({ minLength: 1, maxLength: 200, description: 'agent ID or name' }),
    title: Type.Optional(
      Type.Union([
        Type.String({ maxLength: 65_536, description: 'kept to its first 200 characters' }),
        Type.Null(),
      ]),
    ),
    idle_timeout_seconds: Type.Optional(
      Type.Integer({ minimum: 1, maximum: 365 * 24 * 3600, description: 'seconds, not milliseconds' }),
    ),
  },
  { additionalProperties: false },
)
export type CompatCreateSessionBody = Static<typeof CompatCreateSessionBody>

export const CompatListSessionsQuery = Type.Object(
  {
    agent_id: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
    status: Type.Optional(Type.Union(COMPAT_SESSION_STATUSES.map((s) => Type.Literal(s)))),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 500 })),
  },
  { additionalProperties: false },
)
export type CompatListSessionsQuery = Static<typeof CompatListSessionsQuery>

export const CompatResolveQuery = Type.Object(
  { id_prefix: Type.String({ minLength: 1, maxLength: 64 }) },
  { additionalProperties: false },
)
export const CompatIdsSchema = Type.Object({ ids: Type.Array(Type.String()) })

export const CompatSendMessageBody = Type.Object(
  { prompt: Type.String({ minLength: 1, maxLength: 1024 * 1024 }) },
  { additionalProperties: false },
)

export const CompatSecretsBody = Type.Object(
  { secrets: Type.Record(Type.String({ maxLength: 128 }), Type.String({ maxLength: 65536 })) },
  { additionalProperties: false },
)
export const CompatSecretKeysSchema = Type.Object({ keys: Type.Array(Type.String()) })

export const CompatDeletedSchema = Type.Object({ id: Type.String(), deleted: Type.Literal(true) })

export const CompatUserSchema = Type.Object({
  id: Type.String({ description: "the API key's tenant" }),
  email: Type.String({ description: 'no e-mail in Cairn: the API key ID' }),
  full_name: Type.Union([Type.String(), Type.Null()]),
})
export const CompatValidationSchema = Type.Object({ valid: Type.Boolean(), user: CompatUserSchema })

/** Their deploy's `config` field (JSON text in the multipart form): superserve.yaml or the zero-config one. */
export const CompatDeployConfig = Type.Object(
  {
    name: Type.Optional(Type.String()),
    command: Type.Optional(Type.String()),
    entrypoint: Type.Optional(Type.String()),
    mode: Type.Optional(Type.Union([Type.Literal('shim'), Type.Literal('http')])),
    port: Type.Optional(Type.Integer({ minimum: 1, maximum: 65535 })),
    secrets: Type.Optional(Type.Array(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]{0,127}$' }))),
    ignore: Type.Optional(Type.Array(Type.String())),
    /** Cairn's own: the agent protocol of a shim-mode agent (default stdio; `http` is their mode http). */
    protocol: Type.Optional(Type.Union(AGENT_PROTOCOLS.map((p) => Type.Literal(p)))),
  },
  // superserve.yaml may carry keys of theirs Cairn has no use for; they are ignored (docs/compat.md).
  { additionalProperties: true },
)
export type CompatDeployConfig = Static<typeof CompatDeployConfig>

/** The text fields of the multipart deploy form (the archive is the `file` part). */
export const CompatDeployFields = Type.Object({
  name: Type.String({ minLength: 1, maxLength: 63 }),
  command: Type.String({ minLength: 1, maxLength: 16_384 }),
  config: Type.Optional(Type.String({ maxLength: 65_536 })),
})

/**
 * One event of their run stream: the type on the `event:` line, `data` on the `data:` line (as the
 * agent-era SDK and CLI parse it); with `?format=envelope`, the `data:` line carries the whole
 * `{"type", "data"}` object instead. Field names inside `data` are theirs: `tool`, `duration_ms` …
 */
export const CompatRunEventSchema = Type.Union([
  Type.Object({
    type: Type.Literal('run.started'),
    data: Type.Object({ session_id: Type.String(), turn_id: Type.String(), turn: Type.Integer() }),
  }),
  Type.Object({ type: Type.Literal('message.delta'), data: Type.Object({ content: Type.String() }) }),
  Type.Object({
    type: Type.Literal('tool.start'),
    data: Type.Object({
      tool: Type.String(),
      tool_call_id: Type.String(),
      input: Type.Optional(Type.Unknown()),
    }),
  }),
  Type.Object({
    type: Type.Literal('tool.end'),
    data: Type.Object({
      tool_call_id: Type.String(),
      duration_ms: Type.Number(),
      output: Type.Optional(Type.Unknown()),
      is_error: Type.Boolean(),
    }),
  }),
  Type.Object({ type: Type.Literal('status'), data: Type.Object({ message: Type.String() }) }),
  Type.Object({
    type: Type.Literal('run.completed'),
    data: Type.Object({ duration_ms: Type.Number(), max_turns_reached: Type.Boolean(), text: Type.String() }),
  }),
  Type.Object({
    type: Type.Literal('run.failed'),
    data: Type.Object({
      duration_ms: Type.Number(),
      error: Type.Object({ code: Type.String(), message: Type.String() }),
    }),
  }),
  Type.Object({ type: Type.Literal('run.cancelled'), data: Type.Object({ duration_ms: Type.Number() }) }),
  Type.Object({ type: Type.Literal('heartbeat'), data: Type.Object({ at: Type.String() }) }),
])
export type CompatRunEvent = Static<typeof CompatRunEventSchema>

/** How a run stream frames its events: `events` (the default) or `envelope` (see CompatRunEventSchema). */
export const COMPAT_STREAM_FORMATS = ['events', 'envelope'] as const
export type CompatStreamFormat = (typeof COMPAT_STREAM_FORMATS)[number]
export const CompatSendMessageQuery = Type.Object(
  {
    format: Type.Optional(
      Type.Union(
        COMPAT_STREAM_FORMATS.map((f) => Type.Literal(f)),
        {
          description:
            'events (default): `event: <type>` then `data: <the event\'s data>`; envelope: `data: {"type", "data"}`',
        },
      ),
    ),
  },
  { additionalProperties: false },
)
