/** Keeps the last `maxBytes` characters of a stream of text (stderr tails for errors and logs). */
export class TailBuffer {
  private text = ''
  constructor(private readonly maxChars = 8192) {}
  push(chunk: string): void {
    this.text += chunk
    if (this.text.length > this.maxChars * 2) this.text = this.text.slice(-this.maxChars)
  }
  value(): string {
    return this.text.slice(-this.maxChars)
  }
  clear(): void {
    this.text = ''
  }
}
