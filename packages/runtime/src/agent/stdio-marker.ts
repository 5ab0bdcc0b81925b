/**
 * The stdio protocol's turn marker. Shims injected into the agent write
 * `\x1e<nonce>:<linesRead>\x1f` to stdout whenever the agent asks for its next input line, in band
 * with its output so ordering is exact. `linesRead` lets the runtime ignore a marker that belongs
 * to an earlier line.
 */
export const MARK_START = '\u001e'
export const MARK_END = '\u001f'

export interface MarkerChunk {
  /** Agent output that precedes the marker (or all of it when no marker was found). */
  text: string
  /** Lines the agent had read when it asked again, when a marker was found. */
  marker?: number
}

export class StdioMarkerParser {
  private buffer = ''
  private readonly prefix: string

  constructor(nonce: string) {
    this.prefix = MARK_START + nonce + ':'
  }

  /** Feeds output; returns text and markers in order. Holds back a possible partial marker. */
  push(data: string): MarkerChunk[] {
    this.buffer += data
    const out: MarkerChunk[] = []
    for (;;) {
      const start = this.buffer.indexOf(this.prefix)
      if (start < 0) break
      const end = this.buffer.indexOf(MARK_END, start + this.prefix.length)
      if (end < 0) {
        if (start > 0) out.push({ text: this.buffer.slice(0, start) })
        this.buffer = this.buffer.slice(start)
        return out
      }
      const count = Number(this.buffer.slice(start + this.prefix.length, end))
      out.push({ text: this.buffer.slice(0, start), marker: Number.isFinite(count) ? count : 0 })
      this.buffer = this.buffer.slice(end + 1)
    }
    const keep = partialPrefixLength(this.buffer, this.prefix)
    const text = this.buffer.slice(0, this.buffer.length - keep)
    this.buffer = this.buffer.slice(this.buffer.length - keep)
    if (text) out.push({ text })
    return out
  }

  /** What is left when the stream ends. */
  flush(): string {
    const rest = this.buffer
    this.buffer = ''
    return rest
  }
}

function partialPrefixLength(buffer: string, prefix: string): number {
  const max = Math.min(buffer.length, prefix.length - 1)
  for (let len = max; len > 0; len--) {
    if (prefix.startsWith(buffer.slice(buffer.length - len))) return len
  }
  return 0
}
