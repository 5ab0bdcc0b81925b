/**
 * The text of one output stream, bounded: it keeps the start and the end of what a command wrote
 * (the end is where compilers and test runners put their summary) and counts what lies between.
 */
export class ClippedText {
  private readonly decoder = new TextDecoder()
  private readonly headChars: number
  private readonly tailChars: number
  private head = ''
  private tail = ''
  /** Characters dropped between `head` and `tail`. */
  private droppedChars = 0

  /** Keeps enough to give back any `limitChars` or fewer of it (see `clip`). */
  constructor(limitChars: number) {
    this.headChars = Math.floor(limitChars / 2)
    this.tailChars = limitChars - this.headChars
  }

  push(bytes: Uint8Array): void {
    this.add(this.decoder.decode(bytes, { stream: true }))
  }

  /** Characters written in all (once `end` was called). */
  get totalChars(): number {
    return this.head.length + this.droppedChars + this.tail.length
  }

  end(): void {
    this.add(this.decoder.decode())
  }

  /** The text if it fits in `limitChars`; else its start and end around a note of what was left out. */
  clip(limitChars: number): string {
    const total = this.totalChars
    if (total <= limitChars) return this.head + this.tail
    const note = (chars: number) => `\n[… ${chars} characters left out …]\n`
    // The longest note there can be: what is kept around it only grows as the note shrinks.
    const roomChars = limitChars - note(total).length
    if (roomChars <= 0) return (this.head + this.tail).slice(0, limitChars)
    const start = this.head.slice(0, Math.ceil(roomChars / 2))
    const endChars = roomChars - start.length
    const end = endChars > 0 ? this.tail.slice(-endChars) : ''
    return start + note(total - start.length - end.length) + end
  }

  private add(text: string): void {
    const headRoom = this.headChars - this.head.length
    const rest = headRoom > 0 ? text.slice(headRoom) : text
    if (headRoom > 0) this.head += text.slice(0, headRoom)
    if (rest.length === 0) return
    this.tail += rest
    // Trimmed in batches, so a long output costs linear time.
    if (this.tail.length > 2 * this.tailChars + 4096) {
      const cut = this.tail.length - this.tailChars
      this.droppedChars += cut
      this.tail = this.tail.slice(cut)
    }
  }
}

/**
 * How `limitChars` is split between stdout and stderr when both together are longer: each gets
 * half, and what one does not need goes to the other.
 */
export function shareLimit(limitChars: number, stdoutChars: number, stderrChars: number): [number, number] {
  if (stdoutChars + stderrChars <= limitChars) return [stdoutChars, stderrChars]
  const stderrShare = Math.min(stderrChars, Math.max(limitChars - stdoutChars, Math.floor(limitChars / 2)))
  return [limitChars - stderrShare, stderrShare]
}
