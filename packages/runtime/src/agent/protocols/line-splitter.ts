/**
 * Splits text that arrives in pieces into lines. Each line end is looked for in the new piece
 * only, and a line that came in many pieces is joined once, when it ends: appending to one
 * string and searching it again copied a long line once per piece (a jsonl frame of 8 Mi
 * characters in 64 KiB reads: 512 Mi characters copied).
 */
export class LineSplitter {
  private pieces: string[] = []
  private chars = 0

  /** Characters of the line not ended yet. */
  get pendingChars(): number {
    return this.chars
  }

  /** Adds `text`; returns the lines it ends, without their `\n`. */
  push(text: string): string[] {
    const lines: string[] = []
    let start = 0
    for (let newline = text.indexOf('\n'); newline >= 0; newline = text.indexOf('\n', start)) {
      this.pieces.push(text.slice(start, newline))
      lines.push(this.pieces.join(''))
      this.pieces = []
      this.chars = 0
      start = newline + 1
    }
    if (start < text.length) {
      this.pieces.push(start === 0 ? text : text.slice(start))
      this.chars += text.length - start
    }
    return lines
  }

  /** The line not ended yet (what is left at the end of the text), and forgets it. */
  rest(): string {
    const rest = this.pieces.join('')
    this.pieces = []
    this.chars = 0
    return rest
  }
}
