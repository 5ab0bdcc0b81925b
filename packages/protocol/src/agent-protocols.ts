import { type Static, type TSchema, Type } from '@sinclair/typebox'
import { MAX_EXACT_INTEGER } from './common.js'
import { MAX_PROMPT_BYTES } from './sessions.js'

// The wire of two protocols of the agent ecosystem that Cairn serves per agent, A2A (v1.0,
// JSON-RPC binding) and AG-UI (1.0, HTTP + SSE): what Cairn reads of their requests. Their
// objects are open (fields a newer client adds are ignored, as both protocols ask of servers).

const open = { additionalProperties: true } as const
const id = (description: string) => Type.String({ minLength: 1, maxLength: 200, description })
const metadata = Type.Optional(Type.Record(Type.String(), Type.Unknown()))

/** The agent a per-agent protocol route serves: its ID or name, in the key's tenant. */
export const AgentProtocolParams = Type.Object({ agent: id('Agent ID or name') })

/** A JSON-RPC 2.0 request (A2A's JSON-RPC binding); `params` is checked per method. */
export const JsonRpcRequestSchema = Type.Object(
  {
    jsonrpc: Type.Literal('2.0'),
    id: Type.Optional(
      Type.Union([
        Type.String({ maxLength: 200 }),
        Type.Integer({ minimum: -MAX_EXACT_INTEGER, maximum: MAX_EXACT_INTEGER }),
        Type.Null(),
      ]),
    ),
    method: Type.String({ minLength: 1, maxLength: 100 }),
    params: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
  },
  { additionalProperties: false },
)
export type JsonRpcRequest = Static<typeof JsonRpcRequestSchema>

const rpcId = Type.Union([Type.String(), Type.Integer(), Type.Null()])

/** What each SSE event of a streaming A2A method carries: one JSON-RPC response. */
export const JsonRpcStreamAnswerSchema = Type.Union(
  [
    Type.Object(
      { jsonrpc: Type.Literal('2.0'), id: rpcId, result: Type.Record(Type.String(), Type.Unknown()) },
      { title: 'result', description: 'A StreamResponse: task, statusUpdate, artifactUpdate or message' },
    ),
    Type.Object(
      {
        jsonrpc: Type.Literal('2.0'),
        id: rpcId,
        error: Type.Object({
          code: Type.Integer(),
          message: Type.String(),
          data: Type.Optional(Type.Unknown()),
        }),
      },
      { title: 'error', description: "The stream's failure; data[0].metadata.code is Cairn's error code" },
    ),
  ],
  { description: 'Each event is data only (no event name): one JSON-RPC response, as A2A streams them.' },
)

/** A part of an A2A 0.3 message (`kind` names it): Cairn's turns take text. */
export const A2ALegacyPartSchema = Type.Object(
  {
    kind: Type.Union([Type.Literal('text'), Type.Literal('file'), Type.Literal('data')]),
    text: Type.Optional(Type.String({ maxLength: MAX_PROMPT_BYTES })),
    metadata,
  },
  open,
)

/** `message/send` and `message/stream` params (A2A 0.3). */
export const A2ALegacySendParams = Type.Object(
  {
    message: Type.Object(
      {
        kind: Type.Literal('message'),
        messageId: id("The client's ID of the message"),
        contextId: Type.Optional(Type.String({ maxLength: 200 })),
        taskId: Type.Optional(Type.String({ maxLength: 200 })),
        role: Type.Union([Type.Literal('user'), Type.Literal('agent')]),
        parts: Type.Array(A2ALegacyPartSchema, { minItems: 1, maxItems: 100 }),
        metadata,
      },
      open,
    ),
    configuration: Type.Optional(
      Type.Object(
        {
          blocking: Type.Optional(Type.Boolean()),
          historyLength: Type.Optional(Type.Integer({ minimum: 0 })),
        },
        open,
      ),
    ),
    metadata,
  },
  open,
)

/** `tasks/get`, `tasks/cancel` and `tasks/resubscribe` params (A2A 0.3). */
export const A2ALegacyTaskParams = Type.Object(
  {
    id: id('The task: a Cairn turn ID'),
    historyLength: Type.Optional(Type.Integer({ minimum: 0 })),
    metadata,
  },
  open,
)

/** One part of an A2A message: Cairn's turns take text; the others are refused by name. */
export const A2APartSchema = Type.Object(
  {
    text: Type.Optional(Type.String({ maxLength: MAX_PROMPT_BYTES })),
    raw: Type.Optional(Type.String()),
    url: Type.Optional(Type.String()),
    data: Type.Optional(Type.Unknown()),
    mediaType: Type.Optional(Type.String({ maxLength: 200 })),
    filename: Type.Optional(Type.String({ maxLength: 1024 })),
    metadata,
  },
  open,
)

export const A2AMessageSchema = Type.Object(
  {
    messageId: id("The client's ID of the message"),
    contextId: Type.Optional(
      Type.String({ maxLength: 200, description: 'A Cairn session ID, from an answer' }),
    ),
    taskId: Type.Optional(Type.String({ maxLength: 200 })),
    role: Type.Union([Type.Literal('ROLE_USER'), Type.Literal('ROLE_AGENT')]),
    parts: Type.Array(A2APartSchema, { minItems: 1, maxItems: 100 }),
    metadata,
    extensions: Type.Optional(Type.Array(Type.String())),
    referenceTaskIds: Type.Optional(Type.Array(Type.String())),
  },
  open,
)

/** `SendMessage` and `SendStreamingMessage` params. */
export const A2ASendMessageParams = Type.Object(
  {
    tenant: Type.Optional(Type.String({ maxLength: 200 })),
    message: A2AMessageSchema,
    configuration: Type.Optional(
      Type.Object(
        {
          acceptedOutputModes: Type.Optional(Type.Array(Type.String())),
          historyLength: Type.Optional(Type.Integer({ minimum: 0 })),
          returnImmediately: Type.Optional(Type.Boolean()),
        },
        open,
      ),
    ),
    metadata,
  },
  open,
)

/** `GetTask`, `CancelTask` and `SubscribeToTask` params: the task is a turn (its ID). */
export const A2ATaskParams = Type.Object(
  {
    tenant: Type.Optional(Type.String({ maxLength: 200 })),
    id: id('The task: a Cairn turn ID'),
    historyLength: Type.Optional(Type.Integer({ minimum: 0 })),
    metadata,
  },
  open,
)

/** One message of an AG-UI thread as the client holds it (only the last, the user's, is read). */
export const AgUiMessageSchema = Type.Object(
  {
    id: id('The message ID'),
    role: Type.String({ maxLength: 32 }),
    content: Type.Optional(
      Type.Union([
        Type.String({ maxLength: MAX_PROMPT_BYTES }),
        Type.Array(
          Type.Object({ type: Type.String({ maxLength: 32 }), text: Type.Optional(Type.String()) }, open),
        ),
        Type.Null(),
      ]),
    ),
  },
  open,
)

/** AG-UI's RunAgentInput: a run of the thread, whose last message is the user's new one. */
export const AgUiRunInputSchema = Type.Object(
  {
    threadId: id('The thread: a Cairn session ID, or a name the client chose (a session is made for it)'),
    runId: id("The client's ID of the run"),
    protocolVersion: Type.Optional(Type.String({ maxLength: 32 })),
    parentRunId: Type.Optional(Type.String({ maxLength: 200 })),
    state: Type.Optional(Type.Unknown()),
    messages: Type.Array(AgUiMessageSchema, { minItems: 1, maxItems: 100_000 }),
    tools: Type.Optional(Type.Array(Type.Unknown())),
    context: Type.Optional(Type.Array(Type.Unknown())),
    forwardedProps: Type.Optional(Type.Unknown()),
    resume: Type.Optional(Type.Array(Type.Unknown())),
  },
  open,
)
export type AgUiRunInput = Static<typeof AgUiRunInputSchema>

const agUiEvent = (type: string, fields: Record<string, TSchema>, description: string) =>
  Type.Object(
    { type: Type.Literal(type), ...fields },
    { title: type, description, additionalProperties: true },
  )
const str = Type.String()

/** The AG-UI events a Cairn run is streamed as (each the data of one SSE event, no event name). */
export const AgUiEventSchema = Type.Union(
  [
    agUiEvent('RUN_STARTED', { threadId: str, runId: str }, 'First: the turn has begun'),
    agUiEvent(
      'STATE_SNAPSHOT',
      { snapshot: Type.Unknown() },
      '{cairn: {sessionId, turnId, turn, status…}} at start and end',
    ),
    agUiEvent(
      'TEXT_MESSAGE_START',
      { messageId: str, role: Type.Literal('assistant') },
      'A stretch of the reply opens',
    ),
    agUiEvent('TEXT_MESSAGE_CONTENT', { messageId: str, delta: str }, 'Reply text'),
    agUiEvent('TEXT_MESSAGE_END', { messageId: str }, 'The stretch closes (before a tool call, at the end)'),
    agUiEvent(
      'TOOL_CALL_START',
      { toolCallId: str, toolCallName: str },
      'A tool call of the agent (ID: turn ID-agent call ID)',
    ),
    agUiEvent('TOOL_CALL_ARGS', { toolCallId: str, delta: str }, 'Its input as JSON'),
    agUiEvent('TOOL_CALL_END', { toolCallId: str }, 'Its arguments are complete'),
    agUiEvent(
      'TOOL_CALL_RESULT',
      { messageId: str, toolCallId: str, content: str },
      'Its output (JSON unless text)',
    ),
    agUiEvent(
      'CUSTOM',
      { name: Type.Literal('cairn.status'), value: Type.Unknown() },
      "The agent's status line",
    ),
    agUiEvent(
      'RUN_FINISHED',
      { threadId: str, runId: str },
      'Last, when the turn completed or was cancelled (outcome)',
    ),
    agUiEvent('RUN_ERROR', { message: str, code: str }, "Last, when the turn failed: Cairn's error code"),
  ],
  { description: 'AG-UI 1.0 events; the stream ends after RUN_FINISHED or RUN_ERROR.' },
)
