/**
 * A run's events, pushed by a callback (the turn runner's `emit`), read as an async iterator (a
 * protocol library's stream). A push waits until the reader took the event: back-pressure down to
 * the agent, as a slow SSE client applies it on the native stream. A reader that stops (returns
 * early) leaves later pushes unwaited and dropped; the run itself goes on.
 */
export class EventPipe<T> {
  private readonly queue: { value: T; taken: () => void }[] = []
  private wake: (() => void) | undefined
  private ended = false
  private failure: { error: unknown } | undefined
  private abandoned = false

  push(value: T): Promise<void> | undefined {
    if (this.ended || this.abandoned) return undefined
    const taken = new Promise<void>((resolve) => this.queue.push({ value, taken: resolve }))
    this.poke()
    return taken
  }

  /** No more events; `error` is thrown to the reader once the queued ones are read. */
  end(error?: unknown): void {
    if (this.ended) return
    this.ended = true
    if (error !== undefined) this.failure = { error }
    this.poke()
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T, void, undefined> {
    try {
      for (;;) {
        const next = this.queue.shift()
        if (next) {
          next.taken()
          yield next.value
          continue
        }
        if (this.ended) {
          if (this.failure) throw this.failure.error
          return
        }
        await new Promise<void>((resolve) => {
          this.wake = resolve
        })
      }
    } finally {
      this.abandoned = true
      for (const left of this.queue.splice(0)) left.taken()
    }
  }

  private poke(): void {
    const wake = this.wake
    this.wake = undefined
    wake?.()
  }
}
