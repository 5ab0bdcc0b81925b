import { closeSync, mkdirSync, openSync, readSync, rmSync, unlinkSync, writeSync } from 'node:fs'
import path from 'node:path'

export type OutputStream = 'stdout' | 'stderr'

/** Bytes of one stream at one offset of a command's output (both streams together). */
export interface OutputChunk {
  stream: OutputStream
  offset: number
  data: Buffer
}

/** What a read of the log finds from an offset: a gap first (bytes no longer kept), then chunks. */
export interface LogRead {
  gap?: { from: number; to: number } | undefined
  chunks: OutputChunk[]
  /** The offset after the last byte read (where the next read starts). */
  nextOffset: number
}

interface Chunk {
  offset: number
  length: number
  stream: OutputStream
  /** Where its bytes start in its segment's file. */
  filePos: number
}

interface Segment {
  base: number
  file: string
  fd: number
  bytes: number
  chunks: Chunk[]
}

/**
 * A command's output on the node's disk, bounded: segment files of a quarter of the bound each,
 * the oldest deleted once the log holds more than its bound, so it keeps the newest output and a
 * reader before the oldest kept byte is told of the gap (never handed other bytes instead). Offsets
 * count the bytes of stdout and stderr together in the order they arrived; which stream each
 * byte came from is kept beside them (in memory: a log is read back only by the process that
 * wrote it, as its command dies with that process).
 */
export class CommandLog {
  private readonly segments: Segment[] = []
  private total = 0
  private readonly segmentBytes: number
  private closed = false

  constructor(
    private readonly dir: string,
    private readonly maxBytes: number,
  ) {
    this.segmentBytes = Math.max(64 * 1024, Math.ceil(maxBytes / 4))
    mkdirSync(dir, { recursive: true, mode: 0o700 })
  }

  /** The offset of the next byte written: every byte so far, kept or not. */
  get size(): number {
    return this.total
  }

  /** The first offset still kept. */
  get keptFrom(): number {
    return this.segments[0]?.base ?? this.total
  }

  /** Bytes the log holds on disk now. */
  get keptBytes(): number {
    return this.total - this.keptFrom
  }

  append(stream: OutputStream, data: Buffer): void {
    if (this.closed || data.length === 0) return
    let segment = this.segments.at(-1)
    if (!segment || segment.bytes >= this.segmentBytes) segment = this.newSegment()
    writeSync(segment.fd, data, 0, data.length, segment.bytes)
    const last = segment.chunks.at(-1)
    // Consecutive bytes of one stream are one chunk: the index grows with stream switches, not writes.
    if (last && last.stream === stream && last.offset + last.length === this.total) last.length += data.length
    else segment.chunks.push({ offset: this.total, length: data.length, stream, filePos: segment.bytes })
    segment.bytes += data.length
    this.total += data.length
    while (this.keptBytes > this.maxBytes && this.segments.length > 1) this.dropOldest()
  }

  private newSegment(): Segment {
    const file = path.join(this.dir, `segment-${String(this.total).padStart(16, '0')}`)
    const segment = { base: this.total, file, fd: openSync(file, 'w+', 0o600), bytes: 0, chunks: [] }
    this.segments.push(segment)
    return segment
  }

  private dropOldest(): void {
    const oldest = this.segments.shift()
    if (!oldest) return
    closeSync(oldest.fd)
    unlinkSync(oldest.file)
  }

  /** Up to `maxBytes` of output from `offset` (an offset past the end reads nothing). */
  read(offset: number, maxBytes: number): LogRead {
    const from = Math.min(offset, this.total)
    const start = Math.max(from, this.keptFrom)
    const gap = start > from ? { from, to: start } : undefined
    const chunks: OutputChunk[] = []
    let at = start
    let budget = maxBytes
    for (const segment of this.segments) {
      if (segment.base + segment.bytes <= at) continue
      for (const chunk of segment.chunks) {
        if (budget <= 0) break
        const end = chunk.offset + chunk.length
        if (end <= at) continue
        const skip = at - chunk.offset
        const length = Math.min(chunk.length - skip, budget)
        const data = Buffer.alloc(length)
        readSync(segment.fd, data, 0, length, chunk.filePos + skip)
        chunks.push({ stream: chunk.stream, offset: at, data })
        at += length
        budget -= length
      }
    }
    return { gap, chunks, nextOffset: at }
  }

  /** Closes and deletes the log's files. */
  remove(): void {
    this.closed = true
    for (const segment of this.segments.splice(0)) closeSync(segment.fd)
    rmSync(this.dir, { recursive: true, force: true })
  }
}
