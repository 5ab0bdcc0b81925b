import http from 'node:http'
import type net from 'node:net'
import { StringDecoder } from 'node:string_decoder'
import {
  type ApprovalAnswer,
  CairnProblem,
  type ErrorCode,
  type HttpAgent,
  type StatusCause,
} from '@cairn/protocol'
import { createParser } from 'eventsource-parser'
import { LineSplitter } from './line-splitter.js'

/**
 * The `http` agent protocol's requests (the protocol itself is http-protocol.ts): the agent serves HTTP on a port of the sandbox's loopback and each
 * message is one `POST` to it (Superserve's HTTP mode: `POST localhost:PORT/run {"prompt"}`). The
 * request body is `{prompt, sessionId, turn, turnId}`; how the answer maps onto a turn depends on
 * its Content-Type:
 *
 * - `text/event-stream`: each event's data is one frame of the jsonl protocol (`text`, `status`,
 *   `tool.start`, `tool.end`, `metadata`, `turn.done`, `error`);
 * - `application/x-ndjson` (or `application/jsonl`): one such frame per line;
 * - `application/json`: the whole reply, `{"response": "…"}` (their shape), `{"text": "…"}` or a
 *   JSON string;
 * - anything else (`text/plain`, none): the body is the reply text, streamed as it comes.
 *
 * The answer's end ends the turn (a `turn.done` frame may end it first). A status outside 2xx fails
 * the turn and keeps the agent; an agent that does not listen, or drops the connection, loses its
 * sandbox, as a crashed agent does.
 */

export const DEFAULT_HTTP_PATH = '/run'
export const DEFAULT_HTTP_READY_TIMEOUT_MS = 30_000
/** Between two tries to reach a port nothing listens on yet. */
const CONNECT_RETRY_MS = 50
/**
 * A connection the agent dropped is most often the agent dying: the sandbox's exit (which names
 * the crash from stderr) is given this long to be seen before the turn fails for the connection.
 */
const EXIT_GRACE_MS = 500
/** Most characters of an error answer quoted in the turn's message. */
const QUOTED_BODY_CHARS = 500

export interface HttpTurnFailure {
  code: ErrorCode
  cause: StatusCause
  message: string
}

/** Where a turn's answer goes: the caller owns the turn (its events, timeout, teardown). */
export interface HttpTurnSink {
  /** Reply text, as it streams. */
  text(chunk: string): void
  /** One frame of a framed answer (SSE data or an ndjson line), as JSON text. */
  frame(json: string): void
  /** The answer ended: the turn completed, or failed with the agent still serving (a non-2xx status). */
  end(failure?: HttpTurnFailure): void
  /** The agent cannot be talked to: the turn fails and its sandbox goes. */
  fail(failure: HttpTurnFailure): void
  /** False once the turn is over by other means (the agent's exit, the timeout, a cancel). */
  running(): boolean
  /** The answer has begun: the caller may pause and resume it (back-pressure). */
  answering?(answer: http.IncomingMessage): void
}

export interface HttpTurnMessage {
  prompt: string
  sessionId: string
  turn: number
  turnId: string
  /** The answer to the agent's approval request (human review), on the turn that carries it. */
  approval?: ApprovalAnswer
}

/**
 * Sends one message to the agent and feeds its answer to `sink`. Never rejects: every way it can go
 * wrong ends in `sink.end(failure)` or `sink.fail(…)`.
 */
export async function sendHttpTurn(
  connect: (port: number) => Promise<net.Socket>,
  config: HttpAgent,
  message: HttpTurnMessage,
  sink: HttpTurnSink,
  maxChars: number,
): Promise<void> {
  const socket = await connectWhenListening(connect, config, sink)
  if (!socket) return
  if (!sink.running()) {
    socket.destroy()
    return
  }
  const path = config.path ?? DEFAULT_HTTP_PATH
  const body = JSON.stringify(message)
  const request = http.request({
    method: 'POST',
    path,
    host: '127.0.0.1',
    port: config.port,
    headers: {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
      accept: 'text/event-stream, application/x-ndjson, application/json;q=0.9, text/plain;q=0.8',
    },
    createConnection: () => {
      socket.resume()
      return socket
    },
  })
  let answered = false
  request.on('response', (response) => {
    answered = true
    readAnswer(response, config, sink, maxChars, () => request.destroy())
    sink.answering?.(response)
  })
  request.on('error', (error) => {
    if (answered) return
    setTimeout(() => {
      if (!sink.running()) return
      sink.fail({
        code: 'agent_crashed',
        cause: 'agent_crash',
        message: `the agent's HTTP server on port ${config.port} closed the connection before answering ${path} (${error.message})`,
      })
    }, EXIT_GRACE_MS).unref()
  })
  request.end(body)
}

/** A socket to the agent's port, retried while nothing listens there yet (a server starting up). */
async function connectWhenListening(
  connect: (port: number) => Promise<net.Socket>,
  config: HttpAgent,
  sink: HttpTurnSink,
): Promise<net.Socket | undefined> {
  const readyMs = config.readyTimeoutMs ?? DEFAULT_HTTP_READY_TIMEOUT_MS
  const deadline = Date.now() + readyMs
  for (;;) {
    try {
      return await connect(config.port)
    } catch (error) {
      if (!sink.running()) return undefined
      // Not yet: nothing listens on the port, or the sandbox's network is not up (a fresh sandbox).
      const notYet =
        error instanceof CairnProblem &&
        (error.details?.reason === 'refused' || error.code === 'sandbox_not_running')
      if (!notYet) {
        sink.fail({
          code: error instanceof CairnProblem ? error.code : 'port_unreachable',
          cause: 'protocol_error',
          message: `the agent's port ${config.port} cannot be reached: ${(error as Error).message}`,
        })
        return undefined
      }
      if (Date.now() >= deadline) {
        sink.fail({
          code: 'port_unreachable',
          cause: 'protocol_error',
          message: `the agent did not listen on port ${config.port} within ${readyMs / 1000} s (http.port in cairn.yaml; http.readyTimeoutMs to wait longer): an http agent serves HTTP on 127.0.0.1:${config.port} inside its sandbox ($PORT)`,
        })
        return undefined
      }
      await new Promise((resolve) => setTimeout(resolve, CONNECT_RETRY_MS))
      if (!sink.running()) return undefined
    }
  }
}

type AnswerKind = 'sse' | 'ndjson' | 'json' | 'text'

function answerKind(contentType: string | undefined): AnswerKind {
  const type = (contentType ?? '').split(';')[0]?.trim().toLowerCase() ?? ''
  if (type === 'text/event-stream') return 'sse'
  if (
    ['application/x-ndjson', 'application/ndjson', 'application/jsonl', 'application/x-jsonlines'].includes(
      type,
    )
  )
    return 'ndjson'
  if (type === 'application/json' || type.endsWith('+json')) return 'json'
  return 'text'
}

function readAnswer(
  response: http.IncomingMessage,
  config: HttpAgent,
  sink: HttpTurnSink,
  maxChars: number,
  abort: () => void,
): void {
  const status = response.statusCode ?? 0
  const decoder = new StringDecoder('utf8')
  const path = config.path ?? DEFAULT_HTTP_PATH
  const tooLong = (what: string): HttpTurnFailure => ({
    code: 'limit_exceeded',
    cause: 'output_limit',
    message: `the agent answered ${what} longer than ${maxChars} characters and was stopped`,
  })
  let onText: (text: string) => void
  let onEnd: () => HttpTurnFailure | undefined = () => undefined
  if (status < 200 || status > 299) {
    let quoted = ''
    onText = (text) => {
      if (quoted.length < QUOTED_BODY_CHARS) quoted += text
    }
    onEnd = () => {
      const said = quoted.trim().slice(0, QUOTED_BODY_CHARS)
      const wrongPlace = status === 404 || status === 405
      return {
        code: wrongPlace ? 'agent_protocol_error' : 'agent_crashed',
        cause: wrongPlace ? 'protocol_error' : 'turn_failed',
        message: wrongPlace
          ? `the agent answered HTTP ${status} to POST ${path}: it must take each message as a POST to http.path (default /run)${said ? `: ${said}` : ''}`
          : `the agent answered HTTP ${status}${said ? `: ${said}` : ''}`,
      }
    }
  } else {
    const kind = answerKind(response.headers['content-type'])
    if (kind === 'sse') {
      const parser = createParser({ onEvent: (event) => sink.frame(event.data) })
      // eventsource-parser keeps an unfinished event whole; one that never ends is an agent flooding.
      let sinceBoundary = 0
      onText = (text) => {
        const boundary = Math.max(text.lastIndexOf('\n\n'), text.lastIndexOf('\r\n\r\n'))
        sinceBoundary = boundary >= 0 ? text.length - boundary : sinceBoundary + text.length
        if (sinceBoundary > maxChars) return sink.fail(tooLong('an event'))
        parser.feed(text)
      }
    } else if (kind === 'ndjson') {
      const lines = new LineSplitter()
      onText = (text) => {
        for (const line of lines.push(text)) {
          const frame = line.trim()
          if (frame) sink.frame(frame)
        }
        if (lines.pendingChars > maxChars) sink.fail(tooLong('a frame'))
      }
      onEnd = () => {
        const last = lines.rest().trim()
        if (last) sink.frame(last)
        return undefined
      }
    } else if (kind === 'json') {
      let whole = ''
      onText = (text) => {
        whole += text
        if (whole.length > maxChars) sink.fail(tooLong('a JSON body'))
      }
      onEnd = () => {
        const reply = replyOfJson(whole)
        if (reply === undefined)
          return {
            code: 'agent_protocol_error',
            cause: 'protocol_error',
            message: `the agent answered application/json that is not {"response": "…"}, {"text": "…"} nor a string: ${whole.slice(0, 200)}`,
          }
        if (reply) sink.text(reply)
        return undefined
      }
    } else {
      onText = (text) => sink.text(text)
    }
  }
  response.on('data', (chunk: Buffer) => {
    if (!sink.running()) return abort()
    const text = decoder.write(chunk)
    if (text) onText(text)
  })
  response.on('end', () => {
    if (!sink.running()) return
    const rest = decoder.end()
    if (rest) onText(rest)
    if (!sink.running()) return
    sink.end(onEnd())
  })
  response.on('aborted', () => {
    setTimeout(() => {
      if (!sink.running()) return
      sink.fail({
        code: 'agent_crashed',
        cause: 'agent_crash',
        message: `the agent's HTTP server on port ${config.port} closed the connection in the middle of its answer`,
      })
    }, EXIT_GRACE_MS).unref()
  })
}

/** The reply text of a JSON answer, or undefined when it has none of the shapes taken. */
function replyOfJson(body: string): string | undefined {
  let value: unknown
  try {
    value = JSON.parse(body)
  } catch {
    return undefined
  }
  if (typeof value === 'string') return value
  if (value !== null && typeof value === 'object') {
    const record = value as Record<string, unknown>
    for (const key of ['response', 'text']) {
      const reply = record[key]
      if (typeof reply === 'string') return reply
    }
  }
  return undefined
}
