import {
  CairnProblem,
  CommandListSchema,
  CommandOutputEventSchema,
  CommandOutputQuery,
  CommandParams,
  CommandSchema,
  CommandSignalBody,
  CommandStdinBody,
  IdParams,
  MAX_STDIN_BYTES,
  StartCommandBody,
  TerminalSizeSchema,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf, requireWrite } from '../auth/plugin.js'
import { errorResponses, eventStreamMedia } from '../http/responses.js'
import { eventIdAfter, SseWriter, type SseWriterOptions } from '../http/sse.js'
import { COMMAND_WAIT_MS, type CommandService } from './command-service.js'
import { toCommandInfo } from './command-store.js'

const errors = errorResponses(400, 401, 403, 404, 409, 410, 429, 507)
const tags = ['commands']
/** Bytes of output one event carries at most. */
const EVENT_BYTES = 64 * 1024

export function commandRoutes(
  server: FastifyInstance,
  commands: CommandService,
  sse: SseWriterOptions = {},
): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.post(
    '/v1/sessions/:id/commands',
    {
      schema: {
        tags,
        summary:
          "Start a command in the session's sandbox beside its agent (started cold if needed), outside any turn",
        params: IdParams,
        body: StartCommandBody,
        // 422: a session whose setup phase has not run yet runs it first (setup_failed).
        response: { 201: CommandSchema, ...errors, ...errorResponses(422) },
      },
    },
    async (request, reply) => {
      const info = await commands.start(requireWrite(request).tenantId, request.params.id, request.body)
      return reply.status(201).send(info)
    },
  )

  app.get(
    '/v1/sessions/:id/commands',
    {
      schema: {
        tags,
        summary: "The session's commands, newest first (the last 100)",
        params: IdParams,
        response: { 200: CommandListSchema, ...errors },
      },
    },
    async (request) => ({ data: await commands.list(principalOf(request).tenantId, request.params.id) }),
  )

  app.get(
    '/v1/sessions/:id/commands/:commandId',
    {
      schema: {
        tags,
        summary: 'A command: running, or how it ended (exit code or signal)',
        params: CommandParams,
        response: { 200: CommandSchema, ...errors },
      },
    },
    async (request) =>
      commands.get(principalOf(request).tenantId, request.params.id, request.params.commandId),
  )

  app.get(
    '/v1/sessions/:id/commands/:commandId/output',
    {
      schema: {
        tags,
        summary:
          "A command's stdout and stderr from a byte offset, as an SSE stream that follows it to its exit (reattach by offset from any connection)",
        params: CommandParams,
        querystring: CommandOutputQuery,
        headers: Type.Object({
          'last-event-id': Type.Optional(
            Type.String({ maxLength: 32, description: 'The id of the last event received: its offset' }),
          ),
        }),
        response: {
          200: {
            description: 'An event stream of the output from the offset',
            content: { 'text/event-stream': eventStreamMedia(CommandOutputEventSchema) },
          },
          204: {
            description: 'With follow=false: the command runs and has written nothing after the offset yet',
          },
          ...errors,
        },
      },
    },
    async (request, reply) => {
      const { id, commandId } = request.params
      const tenantId = principalOf(request).tenantId
      const offset = request.query.offset ?? eventIdAfter(request.headers['last-event-id'], 0)
      const follow = request.query.follow !== false
      // Refused before the stream starts (unknown session or command: a typed error, not an empty stream).
      await commands.get(tenantId, id, commandId)
      if (!follow) {
        const { read, command } = await commands.read(tenantId, id, commandId, offset, 0, 0)
        const nothing = read !== undefined && !read.gap && read.state.outputBytes <= offset
        if (nothing && command.status === 'running') return reply.status(204).send()
      }
      reply.hijack()
      const writer = new SseWriter(reply.raw, sse)
      await streamOutput(commands, writer, { tenantId, id, commandId, offset, follow }).catch(
        (error: unknown) => {
          const problem = error instanceof CairnProblem ? error : undefined
          if (!writer.closed && problem)
            writer.sendNamed('error', { error: { code: problem.code, message: problem.message } })
          if (!problem)
            request.log.warn({ err: error, command: commandId }, "streaming a command's output failed")
        },
      )
      writer.end()
    },
  )

  app.post(
    '/v1/sessions/:id/commands/:commandId/stdin',
    {
      schema: {
        tags,
        summary: "Write to a command's stdin (base64 `data` and/or `text`); `close` ends it",
        params: CommandParams,
        body: CommandStdinBody,
        response: { 200: CommandSchema, ...errors },
      },
    },
    async (request) => {
      const { data, text, close } = request.body
      const bytes = Buffer.concat([Buffer.from(data ?? '', 'base64'), Buffer.from(text ?? '', 'utf8')])
      if (bytes.length > MAX_STDIN_BYTES)
        throw new CairnProblem('payload_too_large', `one stdin write takes at most ${MAX_STDIN_BYTES} bytes`)
      const { id, commandId } = request.params
      return commands.stdin(requireWrite(request).tenantId, id, commandId, bytes, close === true)
    },
  )

  app.post(
    '/v1/sessions/:id/commands/:commandId/resize',
    {
      schema: {
        tags,
        summary: 'Resize the terminal of a command started with `tty`',
        params: CommandParams,
        body: TerminalSizeSchema,
        response: { 200: CommandSchema, ...errors },
      },
    },
    async (request) => {
      const { id, commandId } = request.params
      return commands.resize(requireWrite(request).tenantId, id, commandId, request.body)
    },
  )

  app.post(
    '/v1/sessions/:id/commands/:commandId/signal',
    {
      schema: {
        tags,
        summary: 'Send a signal to a command and what it started (its process group); SIGKILL kills it',
        params: CommandParams,
        body: CommandSignalBody,
        response: { 200: CommandSchema, ...errors },
      },
    },
    async (request) => {
      const { id, commandId } = request.params
      return commands.signal(requireWrite(request).tenantId, id, commandId, request.body.signal)
    },
  )
}

/**
 * Sends the output from `offset` as events, waiting at the node for more while the command runs
 * (with `follow`), then its `exit`. Each event's id is the offset after it.
 */
async function streamOutput(
  commands: CommandService,
  writer: SseWriter,
  at: { tenantId: string; id: string; commandId: string; offset: number; follow: boolean },
): Promise<void> {
  let offset = at.offset
  while (!writer.closed) {
    const waitMs = at.follow ? COMMAND_WAIT_MS : 0
    const { read, command } = await commands.read(
      at.tenantId,
      at.id,
      at.commandId,
      offset,
      EVENT_BYTES * 4,
      waitMs,
    )
    if (read?.gap) await writer.sendNamed('gap', read.gap, read.gap.to)
    for (const chunk of read?.chunks ?? []) {
      const data = Buffer.from(chunk.data)
      for (let start = 0; start < data.length; start += EVENT_BYTES) {
        const part = data.subarray(start, start + EVENT_BYTES)
        const partOffset = chunk.offset + start
        await writer.sendNamed(
          'output',
          { stream: chunk.stream, offset: partOffset, data: part.toString('base64') },
          partOffset + part.length,
        )
      }
    }
    if (read) offset = read.nextOffset
    const ended = command.status !== 'running'
    const caughtUp = !read || offset >= Number(command.output_bytes)
    if (ended && caughtUp) {
      await writer.sendNamed('exit', { command: toCommandInfo(command) })
      return
    }
    if (!at.follow && (read?.chunks.length ?? 0) === 0) return
  }
}
