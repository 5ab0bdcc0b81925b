import { StringDecoder } from 'node:string_decoder'
import { CairnProblem, isErrorCode } from '@cairn/protocol'

/**
 * The JSON of the remote runtime port: plain JSON, with the two things JSON cannot say marked
 * by a key of their own (bytes as base64, instants as ISO strings).
 */
const BYTES = '$cairn.bytes'
const DATE = '$cairn.date'
/**
 * Anyone else's object of one key that is a mark's (an agent's tool input `{"$cairn.bytes": …}`)
 * crosses as `{"$cairn.object": [key, value]}`: it came out of the hop as a Buffer or a Date.
 */
const OBJECT = '$cairn.object'
const MARKS = new Set([BYTES, DATE, OBJECT])

export function encodeJson(value: unknown): string {
  return JSON.stringify(marked(value))
}

/**
 * The value with its Buffers and Dates marked, made before `JSON.stringify` runs: a replacer sees
 * a Buffer only after its `toJSON` made an array of one number per byte (a 48 MiB archive: 6 s of
 * the event loop).
 */
function marked(value: unknown): unknown {
  if (value === null || typeof value !== 'object') return value
  if (Buffer.isBuffer(value)) return { [BYTES]: value.toString('base64') }
  if (value instanceof Date) return { [DATE]: value.toISOString() }
  if (Array.isArray(value)) return value.map(marked)
  // Anything else that says how it is JSON (a URL ...) says so itself.
  if (typeof (value as { toJSON?: unknown }).toJSON === 'function') return value
  const out: Record<string, unknown> = {}
  let last = ''
  let count = 0
  for (const [key, inner] of Object.entries(value)) {
    out[key] = marked(inner)
    last = key
    count++
  }
  return count === 1 && MARKS.has(last) ? { [OBJECT]: [last, out[last]] } : out
}

export function decodeJson(text: string): unknown {
  return JSON.parse(text, (_key, value: unknown) => {
    if (value && typeof value === 'object' && !Array.isArray(value)) {
      const keys = Object.keys(value)
      const only = keys.length === 1 ? keys[0] : undefined
      const inner = only ? (value as Record<string, unknown>)[only] : undefined
      if (only === BYTES && typeof inner === 'string') return Buffer.from(inner, 'base64')
      if (only === DATE && typeof inner === 'string') return new Date(inner)
      if (only === OBJECT && Array.isArray(inner) && inner.length === 2 && typeof inner[0] === 'string')
        return { [inner[0]]: inner[1] }
    }
    return value
  })
}

/** A frame of a call's answer (one JSON object a line): a log line, a turn's message, the result, the error or a retry. */
export type Frame =
  | { log: string }
  | { message: unknown }
  | { result: unknown }
  | { error: { code: string; message: string; details?: Record<string, unknown> | undefined } }
  /** A turn's transcript came as the lines after some the node does not hold: send it whole. */
  | { retry: 'transcript' }

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

/**
 * Splits a byte stream into lines (JSON frames), holding a partial line until its end comes. Each
 * chunk is searched once: a line is kept as its pieces and joined when its end arrives, so a frame
 * of n bytes costs O(n), not a search of everything held at every chunk (HTTP/2 delivers 16 KiB
 * data frames: a 32 MiB archive cost 19 s of event loop that way, a node's lease three times over).
 */
export async function* lines(
  stream: AsyncIterable<Buffer | string>,
  maxLineBytes = MAX_FRAME_BYTES,
): AsyncGenerator<string> {
  const decoder = new StringDecoder('utf8')
  let pieces: string[] = []
  let heldLength = 0
  const take = (last: string): string => {
    pieces.push(last)
    const line = pieces.join('')
    pieces = []
    heldLength = 0
    return line
  }
  for await (const chunk of stream) {
    const text = typeof chunk === 'string' ? chunk : decoder.write(chunk)
    let from = 0
    for (let end = text.indexOf('\n'); end >= 0; end = text.indexOf('\n', from)) {
      const line = take(text.slice(from, end))
      from = end + 1
      if (line) yield line
    }
    if (from < text.length) {
      pieces.push(from === 0 ? text : text.slice(from))
      heldLength += text.length - from
    }
    if (heldLength > maxLineBytes)
      throw new CairnProblem('payload_too_large', `a frame of the runtime port is over ${maxLineBytes} bytes`)
  }
  const last = take(decoder.end())
  if (last) yield last
}

/**
 * The largest frame (a call's arguments with an archive in them, base64, or a result): 480 MiB,
 * under the longest string V8 makes (2^29 − 24 characters), so a larger one is `payload_too_large`,
 * not a RangeError.
 */
export const MAX_FRAME_BYTES = 480 * 1024 * 1024

/** HTTP/2 flow-control windows of a call and of a connection (the defaults, 64 KiB, throttle bulk bytes). */
export const STREAM_WINDOW_BYTES = 4 * 1024 * 1024
export const CONNECTION_WINDOW_BYTES = 32 * 1024 * 1024
/**
 * What node:http2 may hold for one connection (MiB; default 10) before it resets its streams with
 * ENHANCE_YOUR_CALM: more than the connection's window, or a large call's data frames received
 * faster than read (a deploy's archive) end as `node_unavailable`.
 */
export const SESSION_MEMORY_MIB = 2 * (CONNECTION_WINDOW_BYTES / 1024 / 1024)

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
