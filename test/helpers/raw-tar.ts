import { gzipSync } from 'node:zlib'

/** One entry of a hand-made tar archive: tests need entries that no well-behaved packer writes. */
export interface RawEntry {
  name: string
  type?: '0' | '1' | '2' | '3' | '4' | '5' | '6'
  linkname?: string
  body?: Buffer | string
  /** Declared size, when it must differ from the body (a lying header). */
  size?: number
  mode?: number
}

/** The 512-byte ustar header of `entry`, declaring `size` bytes. */
export function tarHeader(entry: RawEntry, size: number): Buffer {
  const block = Buffer.alloc(512, 0)
  const put = (offset: number, length: number, value: string) =>
    block.write(value.slice(0, length), offset, 'utf8')
  const octal = (offset: number, length: number, value: number) =>
    put(offset, length, `${value.toString(8).padStart(length - 1, '0')}\0`)
  put(0, 100, entry.name)
  octal(100, 8, entry.mode ?? 0o644)
  octal(108, 8, 0)
  octal(116, 8, 0)
  put(124, 12, `${size.toString(8).padStart(11, '0')}\0`)
  octal(136, 12, 1_700_000_000)
  block.fill(' ', 148, 156)
  put(156, 1, entry.type ?? '0')
  put(157, 100, entry.linkname ?? '')
  put(257, 6, 'ustar\0')
  put(263, 2, '00')
  let sum = 0
  for (const byte of block) sum += byte
  put(148, 8, `${sum.toString(8).padStart(6, '0')}\0 `)
  return block
}

export function rawTar(entries: RawEntry[]): Buffer {
  const parts: Buffer[] = []
  for (const entry of entries) {
    const body = Buffer.isBuffer(entry.body) ? entry.body : Buffer.from(entry.body ?? '')
    parts.push(tarHeader(entry, entry.size ?? body.length))
    parts.push(body)
    const pad = (512 - (body.length % 512)) % 512
    parts.push(Buffer.alloc(pad))
  }
  parts.push(Buffer.alloc(1024))
  return Buffer.concat(parts)
}

export function rawTarGz(entries: RawEntry[]): Buffer {
  return gzipSync(rawTar(entries))
}
