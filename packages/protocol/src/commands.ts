import { type Static, Type } from '@sinclair/typebox'
import { MAX_EXACT_INTEGER, NO_NUL_PATTERN } from './common.js'

/** Signals a command may be sent by name (`POST …/commands/:commandId/signal`). */
export const COMMAND_SIGNALS = [
  'SIGHUP',
  'SIGINT',
  'SIGQUIT',
  'SIGKILL',
  'SIGUSR1',
  'SIGUSR2',
  'SIGTERM',
  'SIGCONT',
  'SIGSTOP',
  'SIGTSTP',
  'SIGWINCH',
] as const
export type CommandSignal = (typeof COMMAND_SIGNALS)[number]

/** A command's state: `running`, `exited` (its code or signal says how), `lost` (its node went). */
export const COMMAND_STATUSES = ['running', 'exited', 'lost'] as const
export type CommandStatus = (typeof COMMAND_STATUSES)[number]

/**
 * Why a command ended other than on its own: its `timeoutMs` ran out, its sandbox was stopped
 * (the session ended, restored, moved, deleted, or its agent crashed), a signal sent to it.
 */
export const COMMAND_END_CAUSES = ['exit', 'signal', 'timeout', 'sandbox_stopped', 'lost'] as const
export type CommandEndCause = (typeof COMMAND_END_CAUSES)[number]

export const DEFAULT_COMMAND_TIMEOUT_MS = 10 * 60 * 1000
export const MAX_COMMAND_TIMEOUT_MS = 24 * 3600 * 1000
/** Bytes of a command's output (stdout and stderr together) its log keeps: the newest ones. */
export const DEFAULT_COMMAND_OUTPUT_BYTES = 8 * 1024 * 1024
/** Logs of ended commands a session keeps on its node (the ones started last). */
export const KEPT_ENDED_COMMANDS = 16
export const MAX_COMMAND_ARGS = 1024
export const MAX_COMMAND_ARG_BYTES = 128 * 1024
/** One stdin write's bytes, decoded. */
export const MAX_STDIN_BYTES = 1024 * 1024

export const TerminalSizeSchema = Type.Object(
  { rows: Type.Integer({ minimum: 1, maximum: 1000 }), cols: Type.Integer({ minimum: 1, maximum: 1000 }) },
  { additionalProperties: false },
)

const EnvName = Type.String({ minLength: 1, maxLength: 256, pattern: '^[A-Za-z_][A-Za-z0-9_]*$' })
/** An argument or an env value: what a process is given is a C string, so it holds no NUL. */
const ProcessText = Type.String({
  maxLength: MAX_COMMAND_ARG_BYTES,
  pattern: NO_NUL_PATTERN,
  description: 'no NUL character',
})

export const StartCommandBody = Type.Object(
  {
    /** The program and its arguments, run without a shell (`["sh", "-c", "…"]` for one). */
    command: Type.Array(ProcessText, {
      minItems: 1,
      maxItems: MAX_COMMAND_ARGS,
    }),
    /** Variables added to the session's environment (its runtime secrets, egress settings). */
    env: Type.Optional(
      Type.Record(EnvName, ProcessText, {
        maxProperties: 256,
        additionalProperties: false,
      }),
    ),
    /** Directory to run in, relative to /workspace (default: /workspace itself). */
    cwd: Type.Optional(Type.String({ maxLength: 4096 })),
    /** Killed (SIGKILL to its process group) after this long; it keeps the sandbox warm until then. */
    timeoutMs: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_COMMAND_TIMEOUT_MS })),
    /** Keep stdin open for `…/stdin` writes (default: closed at once, as `< /dev/null`). */
    stdin: Type.Optional(Type.Boolean()),
    /**
     * Run it on a terminal of this size (a shell: `["bash", "-l"]`): its output is all `stdout`,
     * stdin stays open, `…/resize` resizes it; `…/terminal` attaches a WebSocket to it.
     */
    tty: Type.Optional(TerminalSizeSchema),
  },
  { additionalProperties: false },
)
export type StartCommandBody = Static<typeof StartCommandBody>

export const CommandSchema = Type.Object({
  id: Type.String(),
  sessionId: Type.String(),
  command: Type.Array(Type.String()),
  cwd: Type.String(),
  status: Type.Union(COMMAND_STATUSES.map((s) => Type.Literal(s))),
  /** Its exit code, once it exited on its own (null while it runs, or when a signal ended it). */
  exitCode: Type.Union([Type.Integer(), Type.Null()]),
  /** The signal that ended it, if one did. */
  signal: Type.Union([Type.String(), Type.Null()]),
  /** How it ended (null while it runs). */
  endCause: Type.Union([Type.Union(COMMAND_END_CAUSES.map((c) => Type.Literal(c))), Type.Null()]),
  /** Bytes of output (stdout and stderr together) it wrote so far: the offset of the next one. */
  outputBytes: Type.Integer({ minimum: 0, maximum: MAX_EXACT_INTEGER }),
  /** The first offset its log still keeps (older output was dropped past the log's bound). */
  keptFromOffset: Type.Integer({ minimum: 0, maximum: MAX_EXACT_INTEGER }),
  stdinOpen: Type.Boolean(),
  timeoutMs: Type.Integer(),
  startedAt: Type.String(),
  endedAt: Type.Union([Type.String(), Type.Null()]),
})
export type CommandInfo = Static<typeof CommandSchema>

export const CommandListSchema = Type.Object({ data: Type.Array(CommandSchema) })
export type CommandList = Static<typeof CommandListSchema>

export const CommandParams = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 200 }),
  commandId: Type.String({ minLength: 1, maxLength: 64 }),
})

export const CommandOutputQuery = Type.Object({
  /** The byte offset to start from (what a dropped stream last received: its last event's `id:`). */
  offset: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_EXACT_INTEGER })),
  /** false: end the stream at the output so far instead of following the command to its exit. */
  follow: Type.Optional(Type.Boolean()),
})

export const CommandStdinBody = Type.Object(
  {
    /** Bytes to write, base64. */
    data: Type.Optional(
      Type.String({ maxLength: Math.ceil(MAX_STDIN_BYTES / 3) * 4, pattern: '^[A-Za-z0-9+/]*={0,2}$' }),
    ),
    /** Text to write (UTF-8); with `data` both are written, `data` first. */
    text: Type.Optional(Type.String({ maxLength: MAX_STDIN_BYTES })),
    /** Close stdin after the write (the command reads EOF). */
    close: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: false },
)
export type CommandStdinBody = Static<typeof CommandStdinBody>

export const CommandSignalBody = Type.Object(
  { signal: Type.Union(COMMAND_SIGNALS.map((s) => Type.Literal(s))) },
  { additionalProperties: false },
)

/**
 * The events of a command's output stream. `output`: bytes of stdout or stderr (`data` base64),
 * at byte `offset` of the command's output (both streams together, in the order they came); its
 * SSE `id:` is the offset after it, so a client reattaches with `?offset=` (or Last-Event-ID) and
 * misses and repeats nothing. `gap`: bytes the log no longer keeps (past its bound). `exit`: the
 * command ended, with the command as it ended, last.
 */
export const CommandOutputEventSchema = Type.Union(
  [
    Type.Object(
      {
        stream: Type.Union([Type.Literal('stdout'), Type.Literal('stderr')]),
        offset: Type.Integer({ minimum: 0 }),
        data: Type.String(),
      },
      { title: 'output' },
    ),
    Type.Object({ from: Type.Integer({ minimum: 0 }), to: Type.Integer({ minimum: 0 }) }, { title: 'gap' }),
    Type.Object({ command: CommandSchema }, { title: 'exit' }),
  ],
  {
    description:
      'Server-sent events: `event: output` {stream, offset, data (base64)} with `id:` the byte offset after it; ' +
      '`event: gap` {from, to} for output the bounded log dropped; `event: exit` {command} last, once the command ' +
      'ended. Reattach with ?offset= (or Last-Event-ID) from any connection or replica: no byte is lost or repeated.',
  },
)
