import { gzipSync } from 'node:zlib'
import { FUZZ_MARKER, type Rng } from './fuzz.js'

/**
 * Hostile tarballs for the archive fuzz suite: headers written by hand (so every field can lie),
 * pax and GNU long-name records, links and devices, then byte-level mutation and broken gzip.
 */

interface Header {
  name: string
  type: string
  linkname?: string
  size: number
  mode: number
  /** Override of the size field's 12 bytes (octal overflow, base-256, garbage). */
  rawSize?: Buffer
  badChecksum?: boolean
  prefix?: string
}

function headerBlock(h: Header): Buffer {
  const block = Buffer.alloc(512, 0)
  const put = (offset: number, length: number, value: string) => {
    const bytes = Buffer.from(value, 'utf8').subarray(0, length)
    bytes.copy(block, offset)
  }
  const octal = (offset: number, length: number, value: number) =>
    put(offset, length, `${value.toString(8).padStart(length - 1, '0')}\0`)
  put(0, 100, h.name)
  octal(100, 8, h.mode & 0o7777777)
  octal(108, 8, 0)
  octal(116, 8, 0)
  if (h.rawSize) h.rawSize.copy(block, 124, 0, 12)
  else put(124, 12, `${h.size.toString(8).padStart(11, '0')}\0`)
  octal(136, 12, 1_700_000_000)
  block.fill(' ', 148, 156)
  put(156, 1, h.type)
  put(157, 100, h.linkname ?? '')
  put(257, 6, 'ustar\0')
  put(263, 2, '00')
  if (h.prefix) put(345, 155, h.prefix)
  let sum = 0
  for (const byte of block) sum += byte
  if (h.badChecksum) sum += 1
  put(148, 8, `${sum.toString(8).padStart(6, '0')}\0 `)
  return block
}

function padded(body: Buffer): Buffer[] {
  const pad = (512 - (body.length % 512)) % 512
  return [body, Buffer.alloc(pad)]
}

function paxRecords(records: Record<string, string>): Buffer {
  let out = ''
  for (const [key, value] of Object.entries(records)) {
    const body = ` ${key}=${value}\n`
    // The length prefix counts itself: find the fixed point.
    let length = Buffer.byteLength(body) + 1
    while (`${length}`.length + Buffer.byteLength(body) !== length)
      length = `${length}`.length + Buffer.byteLength(body)
    out += `${length}${body}`
  }
  return Buffer.from(out, 'utf8')
}

const NORMAL_NAMES = [
  'a.sh',
  'README.md',
  'src/main.py',
  'data/x.txt',
  'dir',
  'dir/sub/file',
  'cairn.yaml',
  '.hidden',
]

/** An entry name: mostly harmless, often hostile; traversal names carry the marker. */
export function entryName(rng: Rng, previous: string[]): string {
  const n = rng.int(1_000_000)
  const marker = `${FUZZ_MARKER}-${n}`
  // About half harmless, so that enough archives pass the checks to exercise extraction.
  switch (rng.int(22)) {
    case 0:
      return `../${marker}`
    case 1:
      return `../../../../../../tmp/${marker}`
    case 2:
      return `/tmp/${marker}`
    case 3:
      return `dir/../../${marker}`
    case 4:
      return `..\\..\\${marker}`
    case 5:
      return `${'d'.repeat(rng.pick([99, 100, 101, 155, 255, 256, 1000, 5000]))}/${marker}`
    case 6:
      return rng.pick(['', '.', './', '/', '//', '..', './..', 'a/./b', 'a//b', 'C:\\x', 'C:/x', '\u0000x'])
    case 7:
      return `${rng.pick(['é', '日本', '🦀', '\u202e', 'Z̤̈', '\ud800'])}${marker}`
    case 8:
      return previous.length > 0 ? rng.pick(previous) : marker
    case 9:
      return previous.length > 0 ? `${rng.pick(previous)}/${marker}` : marker
    case 10:
      return `link/${marker}`
    default:
      return rng.pick(NORMAL_NAMES)
  }
}

function linkTarget(rng: Rng, previous: string[]): string {
  switch (rng.int(10)) {
    case 0:
      return '/etc/passwd'
    case 1:
      return `../${FUZZ_MARKER}-${rng.int(1000)}`
    case 2:
      return '..'
    case 3:
      return rng.pick(['', '.', '/', 'dir/../..', 'a/../../..', '../'.repeat(20)])
    case 4:
      return `/tmp/${FUZZ_MARKER}-${rng.int(1000)}`
    case 5:
      return 'x'.repeat(rng.pick([100, 101, 4000]))
    default:
      return previous.length > 0 ? rng.pick(previous) : rng.pick(NORMAL_NAMES)
  }
}

const TYPES = [
  '0',
  '0',
  '0',
  '0',
  '5',
  '5',
  '2',
  '2',
  '1',
  '1',
  '3',
  '4',
  '6',
  '7',
  'x',
  'g',
  'L',
  'K',
  'S',
  'V',
  'M',
  'N',
  'D',
  'Z',
  '\0',
]

/** A tar stream of 1–8 entries, each possibly lying about its size, mode, type or checksum. */
export function structuredTar(rng: Rng, options: { manifest: boolean }): Buffer {
  const parts: Buffer[] = []
  const names: string[] = []
  if (options.manifest) {
    const body = Buffer.from(`name: fuzz-${rng.int(1000)}\ncommand: bash a.sh\n`)
    parts.push(
      headerBlock({ name: 'cairn.yaml', type: '0', size: body.length, mode: 0o644 }),
      ...padded(body),
    )
    names.push('cairn.yaml')
  }
  for (let i = 1 + rng.int(8); i > 0; i--) {
    const type = rng.chance(0.5) ? '0' : rng.pick(TYPES)
    const name = entryName(rng, names)
    const linkname = type === '1' || type === '2' ? linkTarget(rng, names) : undefined
    let body =
      type === '0' || type === '7' ? rng.bytes(rng.pick([0, 1, 511, 512, 513, 2000])) : Buffer.alloc(0)
    if (type === 'x' || type === 'g') {
      const records: Record<string, string> = {}
      records[
        rng.pick(['path', 'linkpath', 'size', 'uid', 'mtime', 'SCHILY.xattr.security.capability', 'comment'])
      ] = rng.chance(0.5)
        ? entryName(rng, names)
        : rng.pick(['-1', '99999999999999999999', 'NaN', '', '1e9', '0'])
      if (rng.chance(0.5)) records.path = entryName(rng, names)
      body = rng.chance(0.9) ? paxRecords(records) : rng.bytes(rng.int(300))
    }
    if (type === 'L' || type === 'K') body = Buffer.from(`${entryName(rng, names)}\0`)
    const mode = rng.pick([0o644, 0o755, 0o4755, 0o2755, 0o6777, 0o1777, 0o000, 0o7777777])
    let size = body.length
    let rawSize: Buffer | undefined
    const lie = rng.int(20)
    if (lie === 0) size = body.length + rng.pick([1, 512, 4096, 1_000_000])
    else if (lie === 1) size = Math.max(0, body.length - 1)
    else if (lie === 2) rawSize = Buffer.from([0x80, 0, 0, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0xff])
    else if (lie === 3) rawSize = Buffer.from('77777777777\0')
    else if (lie === 4)
      rawSize = Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
    else if (lie === 5) rawSize = Buffer.from('zzzzzzzzzzz\0')
    const header: Header = { name, type, size, mode, ...(linkname === undefined ? {} : { linkname }) }
    if (rawSize) header.rawSize = rawSize
    if (rng.chance(0.03)) header.badChecksum = true
    if (rng.chance(0.05)) header.prefix = rng.pick(['..', '/tmp', 'dir', `../${FUZZ_MARKER}`])
    parts.push(headerBlock(header), ...padded(body))
    if (type !== 'x' && type !== 'g' && type !== 'L' && type !== 'K') names.push(name)
  }
  if (rng.chance(0.9)) parts.push(Buffer.alloc(1024))
  if (rng.chance(0.05)) parts.push(rng.bytes(rng.int(2000)))
  return Buffer.concat(parts)
}

/** Flips, truncates or extends bytes: the parser must fail cleanly wherever the damage falls. */
export function damage(rng: Rng, data: Buffer): Buffer {
  const out = Buffer.from(data)
  switch (rng.int(4)) {
    case 0:
      for (let i = 1 + rng.int(8); i > 0 && out.length > 0; i--) out[rng.int(out.length)] = rng.int(256)
      return out
    case 1:
      return out.subarray(0, rng.int(out.length + 1))
    case 2:
      return Buffer.concat([out, rng.bytes(rng.int(1500))])
    default: {
      const at = rng.int(out.length + 1)
      return Buffer.concat([out.subarray(0, at), rng.bytes(1 + rng.int(64)), out.subarray(at)])
    }
  }
}

/** One fuzz archive and how it was made (for the report of a finding). */
export function fuzzArchive(rng: Rng): { data: Buffer; recipe: string } {
  const r = rng.next()
  if (r < 0.03) return { data: rng.bytes(rng.int(4000)), recipe: 'random bytes' }
  if (r < 0.05) return { data: gzipSync(rng.bytes(rng.int(4000))), recipe: 'gzip of random bytes' }
  if (r < 0.06) return { data: Buffer.alloc(rng.pick([0, 1, 10, 512, 1024])), recipe: 'zeros' }
  const manifest = rng.chance(0.5)
  let tar = structuredTar(rng, { manifest })
  let recipe = 'structured'
  if (rng.chance(0.15)) {
    tar = damage(rng, tar)
    recipe += '+damaged tar'
  }
  const compression = rng.next()
  if (compression < 0.15) return { data: tar, recipe: `${recipe}, uncompressed` }
  let data = gzipSync(tar)
  if (compression < 0.25) {
    data = damage(rng, data)
    recipe += ', damaged gzip'
  } else if (compression < 0.27) {
    data = gzipSync(data)
    recipe += ', gzip twice'
  } else recipe += ', gzip'
  return { data, recipe }
}
