import type { IncomingMessage, Server } from 'node:http'
import type { Duplex } from 'node:stream'
import { CairnProblem, COMMAND_SIGNALS, newId } from '@cairn/protocol'
import type { Logger } from 'pino'
import { type RawData, type WebSocket, WebSocketServer } from 'ws'
import type { ApiKeyStore, Principal } from '../auth/api-keys.js'
import type { RateLimits } from '../auth/plugin.js'
import type { BodyBudget } from '../http/body-budget.js'
import { toErrorBody } from '../http/errors.js'
import { DEFAULT_SSE_STALL_MS } from '../http/sse.js'
import { COMMAND_WAIT_MS, type CommandService } from './command-service.js'
import { toCommandInfo } from './command-store.js'

const TERMINAL_PATH = /^\/v1\/sessions\/([^/?]{1,200})\/commands\/([^/?]{1,64})\/terminal(?:\?(.*))?$/
/** A browser cannot set Authorization on a WebSocket: it offers the key as a subprotocol instead. */
const KEY_PROTOCOL = 'cairn-key.'
/** Bytes of output one message carries at most. */
const MESSAGE_BYTES = 64 * 1024
/** Input one message may carry (as a stdin write). */
const MAX_INPUT_BYTES = 1024 * 1024
/** Input a socket's messages may hold in memory before the command took it (the socket is paused past it). */
const INPUT_QUEUE_BYTES = 4 * MAX_INPUT_BYTES
/** Messages a socket may have waiting for their turn before it is paused (each costs database statements). */
const INPUT_QUEUE_MESSAGES = 256
/** How long a message past its key's or tenant's rate budget waits before it asks again. */
const RATE_WAIT_MS = 100

/**
 * Terminals over WebSocket (docs/commands.md): `GET /v1/sessions/{id}/commands/{commandId}/terminal`
 * with `Upgrade: websocket` attaches to a command (a `tty` one for a shell): binary messages from
 * the client are its stdin, text ones control it (`{"type":"resize","rows","cols"}`,
 * `{"type":"signal","signal"}`, `{"type":"close"}` to end stdin); the server sends its output as
 * binary messages from `?offset=` (default 0), then `{"type":"exit","command"}` and closes. It is
 * the same command API underneath: any replica serves it, and a dropped socket reattaches by offset.
 * Every other Upgrade request to the API listener is answered 404 and closed.
 */
export class TerminalSockets {
  private readonly wss = new WebSocketServer({ noServer: true, maxPayload: MAX_INPUT_BYTES })
  private readonly sockets = new Set<Duplex>()
  private closing = false

  constructor(
    private readonly deps: {
      keys: ApiKeyStore
      commands: CommandService
      logger: Logger
      /** The key's and tenant's budgets: an upgrade is one request of them, as a route's. */
      rateLimits?: RateLimits | undefined
      /** A client that takes nothing of its output for this long is cut, as an SSE stream's (default 60 s). */
      stallMs?: number | undefined
      /**
       * What request bodies hold, per tenant and in all: a socket's input not yet taken by its
       * command counts there too, and a socket is read no further while its tenant's is spent.
       */
      bodyBudget?: BodyBudget | undefined
    },
  ) {}

  attach(server: Server): void {
    server.on('upgrade', (request: IncomingMessage, socket: Duplex, head: Buffer) => {
      this.sockets.add(socket)
      socket.once('close', () => this.sockets.delete(socket))
      socket.on('error', () => undefined)
      void this.upgrade(request, socket, head).catch((error: unknown) => refuse(socket, error))
    })
  }

  private async upgrade(request: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const match = TERMINAL_PATH.exec(request.url ?? '')
    if (!match || request.method !== 'GET' || request.headers.upgrade?.toLowerCase() !== 'websocket')
      throw new CairnProblem(
        'not_found',
        'the API takes WebSocket upgrades only at …/commands/{commandId}/terminal',
      )
    const principal = await this.principal(request)
    this.deps.rateLimits?.admit(principal)
    if (principal.role === 'read') throw new CairnProblem('forbidden', 'this API key is read-only')
    const sessionId = pathPart(match[1])
    const commandId = pathPart(match[2])
    const offset = Number(new URLSearchParams(match[3] ?? '').get('offset') ?? 0)
    if (!Number.isSafeInteger(offset) || offset < 0)
      throw new CairnProblem('validation_failed', 'offset must be a whole number of bytes')
    // Refused before the handshake: an unknown session or command is a typed HTTP answer.
    await this.deps.commands.get(principal.tenantId, sessionId, commandId)
    this.wss.handleUpgrade(request, socket, head, (ws) => {
      // A frame the protocol refuses (past the payload bound, text that is no UTF-8, unmasked, a
      // reserved opcode) is said on the socket's error event as ws closes it (1002, 1007, 1009):
      // with no listener it was thrown, and one client's frame ended the server's process.
      ws.on('error', (error: Error) =>
        this.deps.logger.info({ err: error, command: commandId }, 'a terminal socket sent a refused frame'),
      )
      const at = { tenantId: principal.tenantId, sessionId, commandId }
      this.bridge(ws, at, offset, principal).catch((error: unknown) => {
        this.deps.logger.warn({ err: error, command: commandId }, 'a terminal socket failed')
        ws.close(1011, error instanceof CairnProblem ? error.code : 'internal')
      })
    })
  }

  private async principal(request: IncomingMessage): Promise<Principal> {
    const header = request.headers.authorization
    const bearer = header ? /^Bearer\s+(\S+)$/i.exec(header)?.[1] : undefined
    const offered = String(request.headers['sec-websocket-protocol'] ?? '')
      .split(',')
      .map((p) => p.trim())
      .find((p) => p.startsWith(KEY_PROTOCOL))
    const key = bearer ?? offered?.slice(KEY_PROTOCOL.length)
    if (!key) throw new CairnProblem('unauthorized', 'missing API key: send Authorization: Bearer <key>')
    const principal = await this.deps.keys.verify(key)
    if (!principal) throw new CairnProblem('unauthorized', 'invalid API key')
    return principal
  }

  /** Output to the socket from `offset` until the command's end; the socket's messages to the command. */
  private async bridge(
    ws: WebSocket,
    at: { tenantId: string; sessionId: string; commandId: string },
    offset: number,
    principal: Principal,
  ): Promise<void> {
    const { commands } = this.deps
    let open = true
    ws.on('close', () => {
      open = false
    })
    // One message at a time, in the order sent: keys typed and then `close` must reach the
    // command as typed (each goes through the database first, whose answers can come in any order).
    // Past INPUT_QUEUE_BYTES or INPUT_QUEUE_MESSAGES not yet taken, the socket is read no further
    // until they are (the client's sends wait in its TCP window): the server holds what the command
    // takes, not what a client sends.
    let inputs = Promise.resolve()
    const queued = { bytes: 0, messages: 0 }
    const budget = this.deps.bodyBudget
    // Without this, each socket held its 4 MiB for a command that reads nothing, and a tenant
    // opened as many as its connections (60 sockets: 380 MiB of the server's memory).
    const withinBudget = () => budget?.within(at.tenantId) ?? true
    const resumeWhenRoom = () => {
      if (!open || !ws.isPaused) return
      if (queued.bytes > INPUT_QUEUE_BYTES / 2 || queued.messages > INPUT_QUEUE_MESSAGES / 2) return
      if (withinBudget()) ws.resume()
      else setTimeout(resumeWhenRoom, RATE_WAIT_MS).unref()
    }
    ws.on('message', (data: RawData, binary: boolean) => {
      const bytes = rawBytes(data)
      queued.bytes += bytes
      queued.messages++
      const room = budget?.hold(at.tenantId, bytes) ?? true
      if (!room || queued.bytes > INPUT_QUEUE_BYTES || queued.messages > INPUT_QUEUE_MESSAGES) ws.pause()
      inputs = inputs.then(async () => {
        try {
          await this.admitted(principal)
          await this.input(at, data, binary).catch((error: unknown) => {
            if (open) ws.send(JSON.stringify({ type: 'error', error: problemOf(error) }))
          })
        } finally {
          queued.bytes -= bytes
          queued.messages--
          budget?.give(at.tenantId, bytes)
        }
        resumeWhenRoom()
      })
    })
    let next = offset
    while (open) {
      const { read, command } = await commands.read(
        at.tenantId,
        at.sessionId,
        at.commandId,
        next,
        MESSAGE_BYTES * 4,
        COMMAND_WAIT_MS,
      )
      // Bytes no longer kept are said, never skipped silently (the output stream's `gap` event).
      if (read?.gap && open) ws.send(JSON.stringify({ type: 'gap', ...read.gap }))
      for (const chunk of read?.chunks ?? []) {
        const data = Buffer.from(chunk.data)
        for (let start = 0; start < data.length; start += MESSAGE_BYTES)
          await sendBinary(ws, data.subarray(start, start + MESSAGE_BYTES), this.deps.stallMs)
      }
      if (read) next = read.nextOffset
      if (command.status !== 'running' && (!read || next >= Number(command.output_bytes))) {
        if (open) ws.send(JSON.stringify({ type: 'exit', command: toCommandInfo(command) }))
        ws.close(1000)
        return
      }
    }
  }

  /**
   * Takes one request of the key's and the tenant's rate budgets for a message (a stdin write or a
   * control message costs what its HTTP route costs), waiting while they are spent: the message is
   * not lost, and the socket is read no further once its queue is full.
   */
  private async admitted(principal: Principal): Promise<void> {
    const limits = this.deps.rateLimits
    for (;;) {
      try {
        limits?.admit(principal)
        return
      } catch (error) {
        // A stopping server waits for no budget (nor does its process wait for these timers).
        if (!(error instanceof CairnProblem) || error.code !== 'rate_limited' || this.closing) throw error
      }
      await new Promise((resolve) => setTimeout(resolve, RATE_WAIT_MS).unref())
    }
  }

  private async input(
    at: { tenantId: string; sessionId: string; commandId: string },
    data: RawData,
    binary: boolean,
  ): Promise<void> {
    const { commands } = this.deps
    const bytes = Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data as ArrayBuffer)
    if (binary) {
      await commands.stdin(at.tenantId, at.sessionId, at.commandId, bytes, false)
      return
    }
    const parsed: unknown = JSON.parse(bytes.toString('utf8'))
    // `null`, a number or an array is no message: refused like an unknown type, not a TypeError.
    const message = (isObject(parsed) ? parsed : {}) as Record<string, unknown>
    if (message.type === 'resize' && isSize(message.rows) && isSize(message.cols))
      await commands.resize(at.tenantId, at.sessionId, at.commandId, {
        rows: message.rows,
        cols: message.cols,
      })
    else if (message.type === 'signal' && (COMMAND_SIGNALS as readonly unknown[]).includes(message.signal))
      await commands.signal(at.tenantId, at.sessionId, at.commandId, String(message.signal))
    else if (message.type === 'close')
      await commands.stdin(at.tenantId, at.sessionId, at.commandId, Buffer.alloc(0), true)
    else
      throw new CairnProblem('validation_failed', 'a text message is {"type":"resize"|"signal"|"close", …}')
  }

  /** Closes every terminal socket (the server is stopping). */
  close(): void {
    this.closing = true
    for (const socket of this.sockets) socket.destroy()
    this.wss.close()
  }
}

/** The bytes of a message as ws hands it (a Buffer, an ArrayBuffer or fragments). */
const rawBytes = (data: RawData): number =>
  Array.isArray(data) ? data.reduce((sum, part) => sum + part.length, 0) : data.byteLength

const isObject = (value: unknown): value is object =>
  typeof value === 'object' && value !== null && !Array.isArray(value)

/** A path parameter decoded; one that is not valid percent-encoded UTF-8 is refused as the router refuses it. */
function pathPart(raw: string | undefined): string {
  try {
    return decodeURIComponent(raw ?? '')
  } catch {
    throw new CairnProblem('bad_request', 'the request path is not valid percent-encoded UTF-8')
  }
}

const isSize = (value: unknown): value is number =>
  typeof value === 'number' && Number.isInteger(value) && value >= 1 && value <= 1000

/**
 * Sends `data` and waits until the socket took it; a client that takes nothing for `stallMs` is
 * cut (it reattaches by offset), so a reader that stopped reading holds nothing of the server's.
 */
function sendBinary(ws: WebSocket, data: Buffer, stallMs = DEFAULT_SSE_STALL_MS): Promise<void> {
  return new Promise((resolve) => {
    const stall = setTimeout(() => {
      ws.terminate()
      resolve()
    }, stallMs)
    ws.send(data, { binary: true }, () => {
      clearTimeout(stall)
      resolve()
    })
  })
}

function problemOf(error: unknown): { code: string; message: string } {
  if (error instanceof CairnProblem) return { code: error.code, message: error.message }
  if (error instanceof SyntaxError) return { code: 'invalid_json', message: error.message }
  return { code: 'internal', message: 'the message could not be handled' }
}

/** Answers a refused upgrade as HTTP, in the registry's shape, and closes the connection. */
function refuse(socket: Duplex, error: unknown): void {
  const { status, body } = toErrorBody(error, newId('request'))
  const text = JSON.stringify(body)
  socket.end(
    `HTTP/1.1 ${status} ${status === 404 ? 'Not Found' : 'Refused'}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
  )
}
