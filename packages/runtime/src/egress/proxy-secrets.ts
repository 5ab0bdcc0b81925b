import type http from 'node:http'
import { Transform, type TransformCallback } from 'node:stream'
import zlib from 'node:zlib'
import { decide } from './policy.js'

/** A `proxy`-scoped secret as the egress proxy holds it: the agent only ever sees `standIn`. */
export interface ProxySecret {
  name: string
  /** The token in the agent's environment; replaced by `value` on the way to a bound host. */
  standIn: string
  value: string
  /** Hosts in allowlist syntax (`api.example.com`, `*.example.com`, `host:8443`). */
  hosts: readonly string[]
  /** Request headers (lowercase) it is swapped into besides `CREDENTIAL_HEADERS`, as declared. */
  headers?: readonly string[] | undefined
}

/** The secrets bound to a host and port, by the same matching rules as the allowlist. */
export function secretsBoundTo(secrets: readonly ProxySecret[], host: string, port: number): ProxySecret[] {
  return secrets.filter((secret) => decide({ allow: secret.hosts }, host, port).allowed)
}

function replaceAll(text: string, from: string, to: string): string {
  return from.length > 0 && text.includes(from) ? text.split(from).join(to) : text
}

/**
 * The request headers that carry credentials: the only ones a stand-in is swapped in. A stand-in
 * anywhere else (`X-Meta`, a comment field, object metadata) reaches the bound host as is, so the
 * agent cannot have the host store the real value where it can be read back unscrubbed later.
 * URLs and bodies are never rewritten.
 */
export const CREDENTIAL_HEADERS: ReadonlySet<string> = new Set([
  'authorization',
  'proxy-authorization',
  'x-api-key',
  'api-key',
  'x-goog-api-key',
  'x-auth-token',
  'x-access-token',
  'private-token',
])

/**
 * Request headers with every stand-in in a credential header (`CREDENTIAL_HEADERS`: `Authorization:
 * Bearer <stand-in>`, `x-api-key: <stand-in>`, or one its secret declares) replaced by its real
 * value; other headers pass unchanged. Also names the secrets used.
 */
export function swapInSecrets(
  headers: http.IncomingHttpHeaders,
  secrets: readonly ProxySecret[],
): { headers: http.OutgoingHttpHeaders; used: string[] } {
  const used = new Set<string>()
  const swap = (name: string, value: string) => {
    let out = value
    for (const secret of secrets) {
      if (!CREDENTIAL_HEADERS.has(name) && !secret.headers?.includes(name)) continue
      const next = replaceAll(out, secret.standIn, secret.value)
      if (next !== out) used.add(secret.name)
      out = next
    }
    return out
  }
  const out: http.OutgoingHttpHeaders = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue
    const lower = name.toLowerCase()
    out[name] = Array.isArray(value) ? value.map((v) => swap(lower, v)) : swap(lower, value)
  }
  return { headers: out, used: [...used] }
}

/**
 * Response headers with any real value an upstream echoes turned back into its stand-in, and any
 * piece of one (`FRAGMENT_BYTES` or more) masked: in values and in names.
 */
export function swapOutSecrets(
  headers: http.IncomingHttpHeaders,
  secrets: readonly ProxySecret[],
): http.OutgoingHttpHeaders {
  // Node reads header bytes as latin1: scrub those bytes, as the body's are.
  const scrub = (text: string, as: readonly ProxySecret[]) =>
    as.length === 0 ? text : scrubBytes(Buffer.from(text, 'latin1'), as).toString('latin1')
  const back = (value: string) => scrub(value, secrets)
  // Node lowercases names: a value spelled in a name is matched lowercased too.
  const lowered = secrets.map((secret) => ({ ...secret, value: secret.value.toLowerCase() }))
  const out: http.OutgoingHttpHeaders = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue
    const scrubbed = Array.isArray(value) ? value.map(back) : back(value)
    const key = scrub(name, lowered)
    const before = out[key]
    out[key] = before === undefined ? scrubbed : [...[before].flat().map(String), ...[scrubbed].flat()]
  }
  return out
}

/** Values shorter than this are not scrubbed from bodies: they would match ordinary text. */
const MIN_SCRUB_LENGTH = 4

/**
 * No run of this many bytes of a secret value reaches the agent: an upstream that hands back a
 * piece of the value it was sent (a slice, half in one header and half in another) has it masked.
 */
export const FRAGMENT_BYTES = 8

/** Turns whole values into their stand-ins, holding back at most one value's length minus one byte. */
class WholeValues {
  private pending: Buffer = Buffer.alloc(0)
  private readonly pairs: { from: Buffer; to: Buffer }[]
  private readonly holdBack: number

  constructor(secrets: readonly ProxySecret[]) {
    this.pairs = secrets
      .filter((s) => Buffer.byteLength(s.value) >= MIN_SCRUB_LENGTH)
      .map((s) => ({ from: Buffer.from(s.value), to: Buffer.from(s.standIn) }))
    this.holdBack = Math.max(0, ...this.pairs.map((p) => p.from.length - 1))
  }

  push(chunk: Buffer, final: boolean): Buffer {
    this.pending = this.pending.length > 0 ? Buffer.concat([this.pending, chunk]) : chunk
    const out: Buffer[] = []
    let at = 0
    for (;;) {
      let best: { index: number; pair: { from: Buffer; to: Buffer } } | undefined
      for (const pair of this.pairs) {
        const index = this.pending.indexOf(pair.from, at)
        if (index >= 0 && (!best || index < best.index)) best = { index, pair }
      }
      if (!best) break
      out.push(this.pending.subarray(at, best.index), best.pair.to)
      at = best.index + best.pair.from.length
    }
    // With no whole value left, one can only start in the last `holdBack` bytes, and only where
    // the rest is the start of a value: everything before goes on now (an SSE event's end too).
    let keepFrom = final ? this.pending.length : Math.max(at, this.pending.length - this.holdBack)
    while (keepFrom < this.pending.length && !this.startsValue(this.pending.subarray(keepFrom))) keepFrom++
    out.push(this.pending.subarray(at, keepFrom))
    this.pending = Buffer.from(this.pending.subarray(keepFrom))
    return Buffer.concat(out)
  }

  private startsValue(tail: Buffer): boolean {
    return this.pairs.some((pair) => pair.from.subarray(0, tail.length).equals(tail))
  }
}

/**
 * Masks every byte covered by a run of `FRAGMENT_BYTES` bytes of a secret value, holding back the
 * last `FRAGMENT_BYTES - 1` bytes (a run may start there). The mask byte is one no value contains,
 * so masking never makes a new run: what leaves holds no `FRAGMENT_BYTES` bytes of any value.
 */
class Fragments {
  private pending: Buffer = Buffer.alloc(0)
  /** Bytes of `pending` already known to be covered by a run (it always starts at 0). */
  private maskedUntil = 0
  /** The first run start in `pending` not checked yet. */
  private checkFrom = 0
  private readonly runs = new Set<string>()
  /** The first 4 bytes of each run: a cheap test before the full one. */
  private readonly heads = new Set<number>()
  private readonly mask: number
  private readonly values: Buffer[]

  constructor(secrets: readonly ProxySecret[]) {
    const values = secrets.map((s) => Buffer.from(s.value)).filter((v) => v.length >= FRAGMENT_BYTES)
    for (const value of values) {
      for (let at = 0; at + FRAGMENT_BYTES <= value.length; at++) {
        this.runs.add(value.toString('latin1', at, at + FRAGMENT_BYTES))
        this.heads.add(value.readUInt32BE(at))
      }
    }
    this.values = values
    const used = new Set(values.flatMap((v) => [...v]))
    this.mask = [0x2a, ...Array(256).keys()].find((byte) => !used.has(byte)) ?? 0x2a
  }

  /** Whether `tail` (shorter than a run) is how some run of a value begins. */
  private startsRun(tail: Buffer): boolean {
    return this.values.some((v) => v.subarray(0, v.length - FRAGMENT_BYTES + tail.length).includes(tail))
  }

  push(chunk: Buffer, final: boolean): Buffer {
    if (this.runs.size === 0) return chunk
    const data = Buffer.concat([this.pending, chunk])
    const masked = new Uint8Array(data.length)
    masked.fill(1, 0, this.maskedUntil)
    let at = this.checkFrom
    for (; at + FRAGMENT_BYTES <= data.length; at++) {
      if (!this.heads.has(data.readUInt32BE(at))) continue
      if (this.runs.has(data.toString('latin1', at, at + FRAGMENT_BYTES)))
        masked.fill(1, at, at + FRAGMENT_BYTES)
    }
    // A byte is settled once no run can cover it: every run starting up to it has been checked, and
    // none can start after it (the bytes from there on begin no run).
    let settled = final ? data.length : Math.max(0, data.length - (FRAGMENT_BYTES - 1))
    while (settled < data.length && !this.startsRun(data.subarray(settled))) settled++
    const out = Buffer.from(data.subarray(0, settled))
    for (let i = 0; i < settled; i++) if (masked[i]) out[i] = this.mask
    this.pending = Buffer.from(data.subarray(settled))
    this.checkFrom = Math.max(0, at - settled)
    // Every run found starts before `settled`, so what it covers of the rest is a prefix.
    this.maskedUntil = masked.subarray(settled).lastIndexOf(1) + 1
    return out
  }
}

/** `bytes` with every whole secret value turned into its stand-in and every piece of one masked. */
export function scrubBytes(bytes: Buffer, secrets: readonly ProxySecret[]): Buffer {
  const whole = new WholeValues(secrets).push(bytes, true)
  return new Fragments(secrets).push(whole, true)
}

/**
 * Turns each secret value in a response body back into its stand-in, and masks any piece of one
 * (`FRAGMENT_BYTES` or more), across chunk boundaries: an upstream that echoes the credential it
 * received (an error message, a "whoami") must not hand it, or a slice of it, to the agent.
 */
export class SecretScrubber extends Transform {
  private readonly whole: WholeValues
  private readonly fragments: Fragments

  constructor(secrets: readonly ProxySecret[]) {
    super()
    this.whole = new WholeValues(secrets)
    this.fragments = new Fragments(secrets)
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, done: TransformCallback): void {
    this.scrub(chunk, false)
    done()
  }

  override _flush(done: TransformCallback): void {
    this.scrub(Buffer.alloc(0), true)
    done()
  }

  private scrub(chunk: Buffer, final: boolean): void {
    const out = this.fragments.push(this.whole.push(chunk, final), final)
    if (out.length > 0) this.push(out)
  }
}

/** Content codings the proxy can undo to scrub a body (Node's zlib), outermost last. */
const DECODERS: Record<string, () => Transform> = {
  gzip: () => zlib.createGunzip(),
  'x-gzip': () => zlib.createGunzip(),
  deflate: () => zlib.createInflate(),
  br: () => zlib.createBrotliDecompress(),
}

/**
 * How to read a response from a host with bound secrets as plain bytes, or why it cannot be: the
 * decoders of its content codings (in order), and a refusal for what could carry a piece of a
 * value past the scrubber: a partial answer (206, `Content-Range`: such requests ask for no
 * range), a transfer coding other than chunked, or a content coding the proxy cannot undo.
 */
export function plainBody(
  statusCode: number,
  headers: http.IncomingHttpHeaders,
): { decoders: Transform[] } | { refusal: string } {
  if (statusCode === 206 || headers['content-range'] !== undefined)
    return { refusal: 'a partial answer from a host with a proxy secret' }
  // Refusals quote the upstream's own spelling (lowercased, a value would dodge the scrubber).
  const transfer = headers['transfer-encoding']?.trim()
  if (transfer !== undefined && transfer.toLowerCase() !== 'chunked')
    return { refusal: `transfer coding '${transfer}' from a host with a proxy secret` }
  const codings = (headers['content-encoding'] ?? '')
    .split(',')
    .map((coding) => coding.trim())
    .filter((coding) => coding !== '' && coding.toLowerCase() !== 'identity')
  const decoders: Transform[] = []
  for (const coding of codings.reverse()) {
    const decoder = DECODERS[coding.toLowerCase()]
    if (!decoder) return { refusal: `content coding '${coding}' from a host with a proxy secret` }
    decoders.push(decoder())
  }
  return { decoders }
}

/**
 * Request headers towards a host with bound secrets, so that its answer can be scrubbed: no range
 * (a slice of an echoed value would be no whole value), no transfer codings, an uncompressed body.
 */
export function askPlainAnswer(headers: http.OutgoingHttpHeaders): void {
  delete headers.range
  delete headers['if-range']
  delete headers.te
  headers['accept-encoding'] = 'identity'
}
