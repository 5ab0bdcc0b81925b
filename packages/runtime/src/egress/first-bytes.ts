import { canonicalAddress } from './address-guard.js'
import { egressName } from './names.js'

/**
 * What a tunnel's client said first, read before anything reaches the host: the TLS server name
 * (SNI) of a ClientHello, or that it is plain HTTP. An opaque CONNECT tunnel is allowed by its
 * target's name; the server name says which name the client is really talking to, so a client
 * cannot open a tunnel to an allowed host and then ask the same address for another site (domain
 * fronting on a shared CDN address). Plain HTTP in a tunnel is not relayed as bytes (a second
 * request on the same connection could name any site): the proxy serves it request by request.
 */
export type FirstBytes =
  | { kind: 'tls'; serverName: string | undefined }
  | { kind: 'http' }
  | { kind: 'other' }
  /** Not readable: a ClientHello split across records, a header block past the cap, garbage. */
  | { kind: 'unreadable'; why: string }
  /** Not complete yet: read more. */
  | { kind: 'partial' }

/** A TLS record carries at most 16 KiB of payload; an HTTP header block past this is refused. */
export const FIRST_BYTES_CAP = 16 * 1024 + 5

// What servers accept as a request line: any case, runs of spaces or tabs (RFC 9112 3). A first
// line that names an HTTP version but does not read as this (HTTP/2's preface) is not let through.
const HTTP_REQUEST_LINE = /^[A-Za-z]{3,10}[ \t]+(\S+)[ \t]+HTTP\/1\.\d[ \t]*\r?\n/i
const HTTP_VERSION = /[ \t]HTTP\/\d/i
// HTTP/0.9's one request, which some servers still answer: `GET /path`, no version, no headers.
const HTTP_09_REQUEST_LINE = /^GET[ \t]+\S+[ \t]*\r?\n/i

/** Reads what the client has sent so far (`partial` until it can tell). */
export function inspectFirstBytes(data: Buffer): FirstBytes {
  if (data.length === 0) return { kind: 'partial' }
  if (data[0] === 0x16) return inspectTls(data)
  // An SSLv2-format ClientHello (RFC 6101 E.2: a two-byte length with the high bit set, then
  // message type 1) has no extensions, so no server name; servers that still take it pick the site.
  if ((data[0] ?? 0) & 0x80) {
    if (data.length < 3) return { kind: 'partial' }
    if (data[2] === 0x01)
      return { kind: 'unreadable', why: 'an SSLv2-format ClientHello, which names no server' }
  }
  // Another TLS record (change_cipher_spec, alert, application data) ahead of the ClientHello
  // would carry it past the check.
  if (data[0] !== undefined && data[0] >= 0x14 && data[0] <= 0x17) {
    if (data.length < 2) return { kind: 'partial' }
    if (data[1] === 0x03) return { kind: 'unreadable', why: 'a TLS record other than a ClientHello first' }
    return { kind: 'other' }
  }
  // Servers skip empty lines ahead of a request line (RFC 9112 2.2).
  let start = 0
  while (data[start] === 0x0d || data[start] === 0x0a) start++
  if (start === data.length)
    return data.length >= FIRST_BYTES_CAP
      ? { kind: 'unreadable', why: 'only empty lines' }
      : { kind: 'partial' }
  if (/^[A-Za-z]/.test(String.fromCharCode(data[start] ?? 0))) return inspectHttp(data.subarray(start))
  return { kind: 'other' }
}

function inspectTls(data: Buffer): FirstBytes {
  if (data.length < 5) return { kind: 'partial' }
  const recordLength = data.readUInt16BE(3)
  if (data.length < 5 + recordLength) {
    return data.length >= FIRST_BYTES_CAP
      ? { kind: 'unreadable', why: 'TLS record too long' }
      : { kind: 'partial' }
  }
  try {
    return { kind: 'tls', serverName: clientHelloServerName(data.subarray(5, 5 + recordLength)) }
  } catch (error) {
    return { kind: 'unreadable', why: (error as Error).message }
  }
}

/** The server_name of a ClientHello that fits its first record (RFC 8446 4.1.2, RFC 6066 3). */
function clientHelloServerName(record: Buffer): string | undefined {
  const reader = new Reader(record)
  if (reader.u8() !== 1) throw new Error('the first TLS handshake message is not a ClientHello')
  const helloLength = reader.u24()
  if (helloLength > record.length - 4) throw new Error('ClientHello split across TLS records')
  reader.skip(2 + 32) // legacy_version, random
  reader.skip(reader.u8()) // legacy_session_id
  reader.skip(reader.u16()) // cipher_suites
  reader.skip(reader.u8()) // legacy_compression_methods
  if (reader.done()) return undefined // no extensions at all
  const extensionsEnd = reader.offset + 2 + reader.peekU16()
  reader.skip(2)
  while (reader.offset < extensionsEnd) {
    const type = reader.u16()
    const length = reader.u16()
    if (type !== 0) {
      reader.skip(length)
      continue
    }
    const listEnd = reader.offset + 2 + reader.u16()
    while (reader.offset < listEnd) {
      const nameType = reader.u8()
      const name = reader.bytes(reader.u16()).toString('latin1')
      if (nameType === 0) return name.toLowerCase()
    }
    return undefined
  }
  return undefined
}

class Reader {
  offset = 0
  constructor(private readonly data: Buffer) {}
  private need(n: number): void {
    if (this.offset + n > this.data.length) throw new Error('truncated ClientHello')
  }
  u8(): number {
    this.need(1)
    return this.data.readUInt8(this.offset++)
  }
  u16(): number {
    const value = this.peekU16()
    this.offset += 2
    return value
  }
  peekU16(): number {
    this.need(2)
    return this.data.readUInt16BE(this.offset)
  }
  u24(): number {
    this.need(3)
    const value = this.data.readUIntBE(this.offset, 3)
    this.offset += 3
    return value
  }
  skip(n: number): void {
    this.need(n)
    this.offset += n
  }
  bytes(n: number): Buffer {
    this.need(n)
    const out = this.data.subarray(this.offset, this.offset + n)
    this.offset += n
    return out
  }
  done(): boolean {
    return this.offset >= this.data.length
  }
}

function inspectHttp(data: Buffer): FirstBytes {
  const firstLine = data.indexOf('\n')
  if (firstLine < 0)
    return data.length >= FIRST_BYTES_CAP
      ? { kind: 'unreadable', why: 'a first line too long' }
      : { kind: 'partial' }
  const line = data.subarray(0, firstLine + 1).toString('latin1')
  if (HTTP_REQUEST_LINE.test(line) || HTTP_09_REQUEST_LINE.test(line)) return { kind: 'http' }
  return HTTP_VERSION.test(line)
    ? { kind: 'unreadable', why: 'a request line other than HTTP/1' }
    : { kind: 'other' }
}

/**
 * Why the first bytes of a tunnel to `target` must not be relayed, if they must not. The allowlist
 * allowed the tunnel for its target, so the client may name that and nothing else:
 * - a tunnel to a name: its TLS server name must be that name, and must be there (a ClientHello
 *   without SNI leaves the host to pick the site: its default, or the Host sent inside the TLS,
 *   which no one here can read);
 * - a tunnel to an address: it may name that address or nothing (clients send no SNI for an
 *   address), never a site, which would ask the shared address for another host.
 * Plain HTTP is never relayed (the proxy serves it request by request, see `EgressProxy`); bytes
 * no check can read are refused either way; other protocols (SSH, SMTP…) go on.
 */
export function firstBytesRefusal(target: string, seen: FirstBytes): string | undefined {
  const wanted = egressName(target)
  if (seen.kind === 'unreadable') return `unreadable start of the connection (${seen.why})`
  if (seen.kind === 'http') return 'plain HTTP is served request by request, not relayed'
  if (seen.kind !== 'tls') return undefined
  const named = seen.serverName === undefined ? undefined : egressName(seen.serverName)
  const address = canonicalAddress(wanted)
  if (address !== undefined) {
    if (named === undefined || canonicalAddress(named) === address) return undefined
    return `TLS server name '${named}' is not the tunnel's address '${wanted}'`
  }
  if (named === undefined) return `TLS ClientHello without a server name on a tunnel to '${wanted}'`
  if (named === wanted) return undefined
  return `TLS server name '${named}' is not the tunnel's host '${wanted}'`
}
