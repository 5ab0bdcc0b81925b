import type http from 'node:http'
import { Transform, type TransformCallback } from 'node:stream'
import { decide } from './policy.js'

/** A `proxy`-scoped secret as the egress proxy holds it: the agent only ever sees `standIn`. */
export interface ProxySecret {
  name: string
  /** The token in the agent's environment; replaced by `value` on the way to a bound host. */
  standIn: string
  value: string
  /** Hosts in allowlist syntax (`api.example.com`, `*.example.com`, `host:8443`). */
  hosts: readonly string[]
}

/** The secrets bound to a host and port, by the same matching rules as the allowlist. */
export function secretsBoundTo(secrets: readonly ProxySecret[], host: string, port: number): ProxySecret[] {
  return secrets.filter((secret) => decide({ allow: secret.hosts }, host, port).allowed)
}

function replaceAll(text: string, from: string, to: string): string {
  return from.length > 0 && text.includes(from) ? text.split(from).join(to) : text
}

/**
 * Request headers with every stand-in replaced by its real value: `Authorization: Bearer <stand-in>`,
 * `x-api-key: <stand-in>`, or any other header that carries it. Also names the secrets used.
 */
export function swapInSecrets(
  headers: http.IncomingHttpHeaders,
  secrets: readonly ProxySecret[],
): { headers: http.OutgoingHttpHeaders; used: string[] } {
  const used = new Set<string>()
  const swap = (value: string) => {
    let out = value
    for (const secret of secrets) {
      const next = replaceAll(out, secret.standIn, secret.value)
      if (next !== out) used.add(secret.name)
      out = next
    }
    return out
  }
  const out: http.OutgoingHttpHeaders = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue
    out[name] = Array.isArray(value) ? value.map(swap) : swap(value)
  }
  return { headers: out, used: [...used] }
}

/** Response headers with any real value an upstream echoes turned back into its stand-in. */
export function swapOutSecrets(
  headers: http.IncomingHttpHeaders,
  secrets: readonly ProxySecret[],
): http.OutgoingHttpHeaders {
  const back = (value: string) =>
    secrets.reduce((text, secret) => replaceAll(text, secret.value, secret.standIn), value)
  const out: http.OutgoingHttpHeaders = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue
    out[name] = Array.isArray(value) ? value.map(back) : back(value)
  }
  return out
}

/** Values shorter than this are not scrubbed from bodies: they would match ordinary text. */
const MIN_SCRUB_LENGTH = 4

/**
 * Turns each secret value in a response body back into its stand-in, across chunk boundaries: an
 * upstream that echoes the credential it received (an error message, a "whoami") must not hand it
 * to the agent. Holds back at most one value's length minus one byte.
 */
export class SecretScrubber extends Transform {
  private pending: Buffer = Buffer.alloc(0)
  private readonly pairs: { from: Buffer; to: Buffer }[]
  private readonly holdBack: number

  constructor(secrets: readonly ProxySecret[]) {
    super()
    this.pairs = secrets
      .filter((s) => Buffer.byteLength(s.value) >= MIN_SCRUB_LENGTH)
      .map((s) => ({ from: Buffer.from(s.value), to: Buffer.from(s.standIn) }))
    this.holdBack = Math.max(0, ...this.pairs.map((p) => p.from.length - 1))
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, done: TransformCallback): void {
    this.pending = this.pending.length > 0 ? Buffer.concat([this.pending, chunk]) : chunk
    this.emitScrubbed(false)
    done()
  }

  override _flush(done: TransformCallback): void {
    this.emitScrubbed(true)
    done()
  }

  private emitScrubbed(final: boolean): void {
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
    // With no whole value left, a partial one can only start in the last `holdBack` bytes.
    const keepFrom = final ? this.pending.length : Math.max(at, this.pending.length - this.holdBack)
    out.push(this.pending.subarray(at, keepFrom))
    this.pending = Buffer.from(this.pending.subarray(keepFrom))
    const data = Buffer.concat(out)
    if (data.length > 0) this.push(data)
  }
}

/** Whether a response body can be scrubbed: not compressed (requests to bound hosts ask for identity). */
export function scrubbable(headers: http.IncomingHttpHeaders): boolean {
  const encoding = headers['content-encoding']?.trim().toLowerCase()
  return !encoding || encoding === 'identity'
}
