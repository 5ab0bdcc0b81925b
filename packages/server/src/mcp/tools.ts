import { Readable } from 'node:stream'
import {
  CairnProblem,
  CreateSessionBody,
  CreateSnapshotBody,
  DiffQuery,
  ForkBody,
  IdParams,
  ListSessionsQuery,
  RestoreBody,
  ResumeBody,
  SendMessageBody,
  WorkspacePathQuery,
} from '@cairn/protocol'
import { type Static, type TObject, type TProperties, Type } from '@sinclair/typebox'
import { requestedPath } from '../files/confine.js'
import { RunCommandInput, runCommand } from './command-tool.js'
import { readWorkspaceFile } from './file-reads.js'
import type { McpServices, ToolAnswer, ToolCall } from './tool-call.js'
import { sendMessage } from './turn.js'

export interface McpTool {
  name: string
  description: string
  /** The arguments' schema: the protocol's schema of the route that does the same. */
  input: TObject
  /** Changes something: refused to a read-only key (and not listed for one). */
  writes: boolean
  run(services: McpServices, call: ToolCall, args: unknown): Promise<ToolAnswer>
}

function tool<S extends TObject>(def: {
  name: string
  description: string
  input: S
  writes: boolean
  run(services: McpServices, call: ToolCall, args: Static<S>): Promise<ToolAnswer>
}): McpTool {
  return def as McpTool
}

/** A session's ID, as the routes take it in their path. */
const SessionId = IdParams.properties.id

/**
 * A route's body or query schema with the session it applies to (the route's path parameter) as
 * `sessionId`; the schema's own rules (a restore's snapshotId-or-turn) come along.
 */
function inSession<T extends TProperties>(schema: TObject<T>) {
  const { anyOf, description } = schema as { anyOf?: unknown; description?: string }
  return Type.Object(
    { sessionId: SessionId, ...schema.properties },
    {
      additionalProperties: false,
      ...(anyOf === undefined ? {} : { anyOf }),
      ...(description === undefined ? {} : { description }),
    },
  )
}

/** Tools that take the session alone. */
const SessionOnly = Type.Object({ sessionId: SessionId }, { additionalProperties: false })

/** The ID split off from the rest: the rest is the route's body as it takes it. */
function bodyOf<A extends { sessionId: string }>(args: A): Omit<A, 'sessionId'> {
  const { sessionId: _, ...body } = args
  return body
}

const json = (value: Record<string, unknown>): ToolAnswer => ({ structured: value })

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/

const WriteFileInput = inSession(
  Type.Object({
    path: Type.String({ minLength: 1, maxLength: WorkspacePathQuery.properties.path.maxLength ?? 4096 }),
    content: Type.String({ description: 'the bytes to write: text, or base64 with encoding base64' }),
    encoding: Type.Optional(Type.Union([Type.Literal('utf8'), Type.Literal('base64')], { default: 'utf8' })),
  }),
)

function fileBytes(args: Static<typeof WriteFileInput>): Buffer {
  if (args.encoding !== 'base64') return Buffer.from(args.content, 'utf8')
  if (!BASE64.test(args.content))
    throw new CairnProblem('validation_failed', 'arguments/content is not base64 (encoding is base64)')
  return Buffer.from(args.content, 'base64')
}

const SESSION_TOOLS: McpTool[] = [
  tool({
    name: 'list_agents',
    description: 'The agents deployed for this API key’s tenant, with their current revision.',
    input: Type.Object({}, { additionalProperties: false }),
    writes: false,
    run: async (s, call) => json({ data: await s.agents.list(call.tenantId) }),
  }),
  tool({
    name: 'list_sessions',
    description: 'Sessions, newest first (filter by agent or status; page with cursor).',
    input: ListSessionsQuery,
    writes: false,
    run: async (s, call, args) => json(await s.sessions.list(call.tenantId, args)),
  }),
  tool({
    name: 'create_session',
    description:
      'Create a session of an agent: a persistent workspace from its current revision (the options of POST /v1/sessions).',
    input: CreateSessionBody,
    writes: true,
    run: async (s, call, args) => json(await s.sessions.create(call.tenantId, args)),
  }),
  tool({
    name: 'resume_session',
    description:
      'Resume an ended, failed or timed-out session on its workspace, optionally with a new policy.',
    input: inSession(ResumeBody),
    writes: true,
    run: async (s, call, args) => json(await s.sessions.resume(call.tenantId, args.sessionId, args.policy)),
  }),
  tool({
    name: 'end_session',
    description: 'End a session: its sandbox stops, its workspace is kept (resume it later).',
    input: SessionOnly,
    writes: true,
    run: async (s, call, args) => json(await s.sessions.end(call.tenantId, args.sessionId)),
  }),
  tool({
    name: 'send_message',
    description:
      "Send a message to the session's agent and wait for its answer (the reply streams as progress notifications).",
    input: inSession(SendMessageBody),
    writes: true,
    run: (s, call, args) => sendMessage(s.sessions, call, args.sessionId, args.prompt),
  }),
]

const WORKSPACE_TOOLS: McpTool[] = [
  tool({
    name: 'list_files',
    description: 'List a directory of the workspace (or of a snapshot); path is relative to /workspace.',
    input: inSession(WorkspacePathQuery),
    writes: false,
    run: async (s, call, args) =>
      json({
        data: await s.workspace.files.listFiles(
          call.tenantId,
          args.sessionId,
          requestedPath(args),
          args.snapshot,
          { signal: call.signal },
        ),
      }),
  }),
  tool({
    name: 'read_file',
    description:
      'Read a file of the workspace (or of a snapshot), up to 1 MiB: text as it is, other bytes as base64.',
    input: inSession(WorkspacePathQuery),
    writes: false,
    run: async (s, call, args) => {
      const path = requestedPath(args)
      const file = await readWorkspaceFile(
        s.workspace,
        call.tenantId,
        args.sessionId,
        path,
        args.snapshot,
        call.signal,
      )
      const structured = { path: path.toString('utf8'), ...file }
      return file.encoding === 'utf8' ? { structured, text: file.content } : { structured }
    },
  }),
  tool({
    name: 'write_file',
    description: 'Write a file of the workspace (made or replaced; its directories are made).',
    input: WriteFileInput,
    writes: true,
    run: async (s, call, args) => {
      const bytes = fileBytes(args)
      await s.workspace.files.writeFile(call.tenantId, args.sessionId, args.path, Readable.from([bytes]))
      return json({ ok: true, path: args.path, size: bytes.length })
    },
  }),
  tool({
    name: 'diff',
    description: "Files added, changed and deleted since the agent's revision (or since a snapshot: from).",
    input: inSession(DiffQuery),
    writes: false,
    run: async (s, call, args) =>
      json(await s.workspace.files.diff(call.tenantId, args.sessionId, args.from, { signal: call.signal })),
  }),
  tool({
    name: 'list_snapshots',
    description: "The session's snapshots (automatic ones after each turn, and manual ones).",
    input: SessionOnly,
    writes: false,
    run: async (s, call, args) =>
      json({ data: await s.workspace.history.list(call.tenantId, args.sessionId, {}, call.signal) }),
  }),
  tool({
    name: 'snapshot',
    description: 'Take a snapshot of the workspace (O(1)); restore or fork from it later.',
    input: inSession(CreateSnapshotBody),
    writes: true,
    run: async (s, call, args) =>
      json(
        await s.workspace.history.snapshot(call.tenantId, args.sessionId, args.label, {
          memory: args.memory === true,
        }),
      ),
  }),
  tool({
    name: 'restore',
    description: 'Replace the workspace with a snapshot (snapshotId, or turn: the snapshot after that turn).',
    input: inSession(RestoreBody),
    writes: true,
    run: async (s, call, args) =>
      json(await s.workspace.history.restore(call.tenantId, args.sessionId, bodyOf(args))),
  }),
  tool({
    name: 'fork',
    description:
      'A new session from a snapshot of this one (snapshotId or turn), with the transcript up to it.',
    input: inSession(ForkBody),
    writes: true,
    run: async (s, call, args) =>
      json(await s.workspace.history.fork(call.tenantId, args.sessionId, bodyOf(args))),
  }),
]

const COMMAND_TOOLS: McpTool[] = [
  tool({
    name: 'run_command',
    description:
      "Run a command in the session's sandbox (beside its agent, on /workspace, under its limits, network policy and secrets; started cold if needed) and wait for its exit: output streams as progress notifications, the result is its exit status with stdout and stderr (their newest 512 KiB).",
    input: RunCommandInput,
    writes: true,
    run: runCommand,
  }),
]

/** Every tool, in the order `tools/list` gives them. */
export const MCP_TOOLS: readonly McpTool[] = [...SESSION_TOOLS, ...WORKSPACE_TOOLS, ...COMMAND_TOOLS]
