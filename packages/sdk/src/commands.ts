import type { CommandInfo, CommandSignal } from '@cairn/protocol'
import { ConnectionError } from './errors.js'
import { checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import { readSse } from './sse.js'
import * as valid from './validators.js'

const path = (id: string, rest = '') => `/v1/sessions/${encodeURIComponent(id)}/commands${rest}`
const asCommand = (v: unknown): CommandInfo => checked(valid.Command, v, 'command')

/** How a command is started (see `Commands.start`). */
export interface StartCommandOptions extends RequestOptions {
  /** Variables added to the session's environment. */
  env?: Record<string, string> | undefined
  /** Directory to run in, relative to /workspace. */
  cwd?: string | undefined
  /** It is killed after this long (default 10 minutes). */
  timeoutMs?: number | undefined
  /** Keep stdin open for `sendStdin` (default: closed at once). */
  stdin?: boolean | undefined
  /** Run it on a terminal of this size (output all on stdout; `resize` resizes it). */
  tty?: { rows: number; cols: number } | undefined
}

/** One event of a command's output stream. */
export type CommandOutput =
  | { type: 'output'; stream: 'stdout' | 'stderr'; offset: number; data: Uint8Array }
  /** Bytes the command's bounded log no longer keeps. */
  | { type: 'gap'; from: number; to: number }
  /** The command ended (last). */
  | { type: 'exit'; command: CommandInfo }

export interface OutputOptions extends RequestOptions {
  /** The byte offset to start from (default 0). */
  offset?: number | undefined
  /** false: stop at the output so far instead of following the command to its end. */
  follow?: boolean | undefined
  /** How many times a dropped stream is picked up again at its offset (default 5). */
  maxReconnects?: number | undefined
}

/** What `run` returns: the command as it ended and its output. */
export interface CommandResult {
  command: CommandInfo
  exitCode: number | null
  signal: string | null
  stdout: string
  stderr: string
}

const decoder = () => new TextDecoder()

/**
 * Commands run in a session's sandbox outside turns (docs/commands.md): start one, follow its
 * output by offset (picked up again where it dropped), write its stdin, signal it.
 */
export class Commands {
  constructor(
    private readonly http: HttpClient,
    private readonly sessionId: string,
  ) {}

  /** Starts `command` (an argv; `['sh', '-c', '…']` for a shell line) beside the agent. */
  async start(command: readonly string[], options: StartCommandOptions = {}): Promise<CommandInfo> {
    const { env, cwd, timeoutMs, stdin, tty, ...request } = options
    return asCommand(
      await this.http.json({
        method: 'POST',
        path: path(this.sessionId),
        json: { command, env, cwd, timeoutMs, stdin, tty },
        ...request,
      }),
    )
  }

  async list(options: RequestOptions = {}): Promise<CommandInfo[]> {
    const body = await this.http.json({ method: 'GET', path: path(this.sessionId), ...options })
    return checked(valid.CommandList, body, 'command list').data
  }

  async get(commandId: string, options: RequestOptions = {}): Promise<CommandInfo> {
    return asCommand(
      await this.http.json({
        method: 'GET',
        path: path(this.sessionId, `/${encodeURIComponent(commandId)}`),
        ...options,
      }),
    )
  }

  /**
   * The command's output from `offset` as it comes, to its `exit`. A stream that drops is picked
   * up again at the offset after the last byte received: nothing is lost or repeated.
   */
  async *output(commandId: string, options: OutputOptions = {}): AsyncGenerator<CommandOutput> {
    const { offset = 0, follow, maxReconnects = 5, ...request } = options
    let at = offset
    let reconnects = 0
    while (true) {
      const opened = await this.http.stream({
        method: 'GET',
        path: path(this.sessionId, `/${encodeURIComponent(commandId)}/output`),
        query: { offset: String(at), follow: follow === false ? 'false' : undefined },
        accept: 'text/event-stream',
        ...request,
      })
      try {
        for await (const message of readSse(opened.response.body as ReadableStream<Uint8Array>)) {
          const event = toOutput(message.event, message.data)
          if (!event) continue
          if (event.type === 'output') at = event.offset + event.data.length
          if (event.type === 'gap') at = event.to
          yield event
          if (event.type === 'exit') return
        }
        if (follow === false) return
      } catch (error) {
        if (request.signal?.aborted || reconnects >= maxReconnects) throw error
      } finally {
        opened.done()
      }
      // The stream ended without the command's end (a dropped connection): again from `at`.
      if (++reconnects > maxReconnects)
        throw new ConnectionError({
          code: 'connection_error',
          message: `the output of ${commandId} kept dropping`,
        })
    }
  }

  /** Waits for the command's end, reading its output (given to `onOutput` as it comes). */
  async wait(
    commandId: string,
    options: OutputOptions & { onOutput?: ((event: CommandOutput) => void) | undefined } = {},
  ): Promise<CommandInfo> {
    const { onOutput, ...rest } = options
    for await (const event of this.output(commandId, rest)) {
      onOutput?.(event)
      if (event.type === 'exit') return event.command
    }
    return this.get(commandId, rest)
  }

  /** Runs a command to its end and collects its output as text. */
  async run(command: readonly string[], options: StartCommandOptions = {}): Promise<CommandResult> {
    const started = await this.start(command, options)
    const out = decoder()
    const err = decoder()
    let stdout = ''
    let stderr = ''
    const ended = await this.wait(started.id, {
      signal: options.signal,
      onOutput: (event) => {
        if (event.type !== 'output') return
        if (event.stream === 'stdout') stdout += out.decode(event.data, { stream: true })
        else stderr += err.decode(event.data, { stream: true })
      },
    })
    return {
      command: ended,
      exitCode: ended.exitCode,
      signal: ended.signal,
      stdout: stdout + out.decode(),
      stderr: stderr + err.decode(),
    }
  }

  /** Writes to the command's stdin (started with `stdin: true`); `close` then ends it. */
  async sendStdin(
    commandId: string,
    data: string | Uint8Array,
    options: RequestOptions & { close?: boolean | undefined } = {},
  ): Promise<CommandInfo> {
    const { close, ...request } = options
    const body = typeof data === 'string' ? { text: data, close } : { data: base64(data), close }
    return asCommand(
      await this.http.json({
        method: 'POST',
        path: path(this.sessionId, `/${encodeURIComponent(commandId)}/stdin`),
        json: body,
        ...request,
      }),
    )
  }

  closeStdin(commandId: string, options: RequestOptions = {}): Promise<CommandInfo> {
    return this.sendStdin(commandId, '', { ...options, close: true })
  }

  /** Sends a signal to the command and what it started (its process group). */
  async signal(commandId: string, signal: CommandSignal, options: RequestOptions = {}): Promise<CommandInfo> {
    return asCommand(
      await this.http.json({
        method: 'POST',
        path: path(this.sessionId, `/${encodeURIComponent(commandId)}/signal`),
        json: { signal },
        ...options,
      }),
    )
  }

  /** Resizes the terminal of a command started with `tty`. */
  async resize(
    commandId: string,
    size: { rows: number; cols: number },
    options: RequestOptions = {},
  ): Promise<CommandInfo> {
    return asCommand(
      await this.http.json({
        method: 'POST',
        path: path(this.sessionId, `/${encodeURIComponent(commandId)}/resize`),
        json: size,
        ...options,
      }),
    )
  }

  kill(commandId: string, options: RequestOptions = {}): Promise<CommandInfo> {
    return this.signal(commandId, 'SIGKILL', options)
  }
}

/** One SSE message of the output stream, checked against the wire schema; undefined for others. */
function toOutput(name: string | undefined, text: string): CommandOutput | undefined {
  if (name !== 'output' && name !== 'gap' && name !== 'exit') return undefined
  const data = checked(valid.CommandOutputEvent, JSON.parse(text), `command ${name} event`) as Record<
    string,
    unknown
  >
  if (name === 'output') {
    const {
      stream,
      offset,
      data: b64,
    } = data as { stream: 'stdout' | 'stderr'; offset: number; data: string }
    if (typeof b64 !== 'string') return undefined
    return { type: 'output', stream, offset, data: fromBase64(b64) }
  }
  if (name === 'gap') return { type: 'gap', ...(data as { from: number; to: number }) }
  return { type: 'exit', command: asCommand((data as { command: unknown }).command) }
}

function base64(bytes: Uint8Array): string {
  let binary = ''
  for (const byte of bytes) binary += String.fromCharCode(byte)
  return btoa(binary)
}

function fromBase64(text: string): Uint8Array {
  const binary = atob(text)
  const out = new Uint8Array(binary.length)
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i)
  return out
}
