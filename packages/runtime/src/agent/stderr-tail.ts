import { closeSync, openSync, readSync, statSync, truncateSync } from 'node:fs'
import { StringDecoder } from 'node:string_decoder'
import type { Sandbox } from '../sandbox/driver.js'
import { TailBuffer } from '../util/tail.js'

/** Characters of an agent's stderr a turn keeps (its last ones). */
const KEPT_CHARS = 16_384
/** Bytes read from the end of a stderr file for them (a UTF-8 character is at most 4 bytes). */
const READ_BYTES = KEPT_CHARS * 4
/**
 * A stderr file longer than this is emptied (its turn's tail kept in memory) when a turn starts and
 * while one runs, so it stays small whatever the agent writes.
 */
export const STDERR_FILE_TRIM_BYTES = 1024 * 1024

/**
 * An agent's stderr since its turn began (the last `KEPT_CHARS` characters): read from the file the
 * sandbox appends it to (`Sandbox.stderrFile`, the bwrap driver's: no descriptor held while the
 * agent waits), or gathered from its pipe.
 */
export class StderrTail {
  private readonly piped = new TailBuffer(KEPT_CHARS)
  private file: string | undefined
  /** Where this turn's stderr starts in the file. */
  private offset = 0
  /** This turn's tail, kept from the file when it was emptied during the turn. */
  private carried = ''

  /** Follows `sandbox`'s stderr (each sandbox of an agent in turn). */
  attach(sandbox: Sandbox): void {
    this.file = sandbox.stderrFile
    if (this.file) return
    const decoder = new StringDecoder('utf8')
    sandbox.stderr.on('data', (chunk: Buffer) => this.piped.push(decoder.write(chunk)))
  }

  /** A turn begins: what came before is not its stderr. */
  mark(): void {
    this.piped.clear()
    this.carried = ''
    this.offset = this.size()
    if (this.offset > STDERR_FILE_TRIM_BYTES) this.empty()
  }

  /** Keeps the file short during a turn: past the trim size, the tail so far is kept here and the file emptied. */
  trim(): void {
    if (this.size() - this.offset <= STDERR_FILE_TRIM_BYTES) return
    this.carried = this.value()
    this.empty()
  }

  /** Reads the file's tail once more and keeps it: the file is going (the agent stopped). */
  keep(): void {
    if (!this.file) return
    this.carried = this.value()
    this.file = undefined
    this.piped.clear()
    this.piped.push(this.carried)
  }

  value(): string {
    if (!this.file) return this.piped.value()
    return `${this.carried}${this.readTail()}`.slice(-KEPT_CHARS)
  }

  private size(): number {
    if (!this.file) return 0
    return statSync(this.file, { throwIfNoEntry: false })?.size ?? 0
  }

  /** Empties the file (the agent appends, so it writes on at the new end). */
  private empty(): void {
    if (!this.file) return
    try {
      truncateSync(this.file, 0)
    } catch {}
    this.offset = 0
  }

  /**
   * This turn's bytes of the file (its last `READ_BYTES`), as text; empty when it is gone. A stat
   * when the agent wrote none (every warm turn of a quiet agent).
   */
  private readTail(): string {
    const end = this.size()
    const start = Math.max(this.offset, end - READ_BYTES)
    if (end <= start) return ''
    let fd: number
    try {
      fd = openSync(this.file as string, 'r')
    } catch {
      return ''
    }
    try {
      const buffer = Buffer.alloc(end - start)
      const read = readSync(fd, buffer, 0, buffer.length, start)
      return buffer.subarray(0, read).toString('utf8')
    } finally {
      closeSync(fd)
    }
  }
}
