import { StringDecoder } from 'node:string_decoder'
import { CairnProblem, isErrorCode } from '@cairn/protocol'

/**
 * The JSON of the remote runtime port: plain JSON, with the two things JSON cannot say marked
 * by a key of their own (bytes as base64, instants as ISO strings).
 */
const BYTES = '$cairn.bytes'
const DATE = '$cairn.date'

export function encodeJson(value: unknown): string {
  return JSON.stringify(value, function (this: Record<string, unknown>, key: string, encoded: unknown) {
    const raw = this[key]
    if (Buffer.isBuffer(raw)) return { [BYTES]: raw.toString('base64') }
    if (raw instanceof Date) return { [DATE]: raw.toISOString() }
    return encoded
  })
}

export function decodeJson(text: string): unknown {
  return JSON.parse(text, (_key, value: unknown) => {
    if (value && typeof value === 'object' && !Array.isArray(value)) {
      const keys = Object.keys(value)
      const only = keys.length === 1 ? keys[0] : undefined
      const inner = only ? (value as Record<string, unknown>)[only] : undefined
      if (only === BYTES && typeof inner === 'string') return Buffer.from(inner, 'base64')
      if (only === DATE && typeof inner === 'string') return new Date(inner)
    }
    return value
  })
}

/** A frame of a call's answer (one JSON object a line): a log line, a turn's message, the result or the error. */
export type Frame =
  | { log: string }
  | { message: unknown }
  | { result: unknown }
  | { error: { code: string; message: string; details?: Record<string, unknown> | undefined } }

/** The error as it crosses: a `CairnProblem` keeps its code, message and details; anything else is `internal`. */
export function errorFrame(error: unknown): Frame {
  if (error instanceof CairnProblem)
    return { error: { code: error.code, message: error.message, details: error.details } }
  return { error: { code: 'internal', message: error instanceof Error ? error.message : String(error) } }
}

export function problemOf(frame: Extract<Frame, { error: unknown }>): CairnProblem {
  const { code, message, details } = frame.error
  return new CairnProblem(isErrorCode(code) ? code : 'internal', message, details)
}

/** Splits a byte stream into lines (JSON frames), holding a partial line until its end comes. */
export async function* lines(
  stream: AsyncIterable<Buffer | string>,
  maxLineBytes = MAX_FRAME_BYTES,
): AsyncGenerator<string> {
  const decoder = new StringDecoder('utf8')
  let pending = ''
  for await (const chunk of stream) {
    pending += typeof chunk === 'string' ? chunk : decoder.write(chunk)
    let end = pending.indexOf('\n')
    while (end >= 0) {
      const line = pending.slice(0, end)
      pending = pending.slice(end + 1)
      if (line) yield line
      end = pending.indexOf('\n')
    }
    if (pending.length > maxLineBytes)
      throw new CairnProblem('payload_too_large', `a frame of the runtime port is over ${maxLineBytes} bytes`)
  }
  pending += decoder.end()
  if (pending) yield pending
}

/** The largest frame (a call's arguments with an archive in them, a result): 1 GiB. */
export const MAX_FRAME_BYTES = 1024 * 1024 * 1024

/** HTTP/2 flow-control windows of a call and of a connection (the defaults, 64 KiB, throttle bulk bytes). */
export const STREAM_WINDOW_BYTES = 4 * 1024 * 1024
export const CONNECTION_WINDOW_BYTES = 32 * 1024 * 1024

/** HTTP/2 headers of a call. */
export const HEADER = {
  /** The call's JSON arguments, base64, when the request body is a byte stream. */
  args: 'cairn-args',
  ownerEpoch: 'cairn-owner-epoch',
  /** How the answer is sent: `frames` (JSON lines) or `bytes` (a file, an export, a port's stream). */
  kind: 'cairn-kind',
  /** A streamed file's size in bytes. */
  size: 'cairn-size',
} as const

export const PATH_PREFIX = '/cairn.port/'
export const EVENTS_PATH = '/cairn.events'
