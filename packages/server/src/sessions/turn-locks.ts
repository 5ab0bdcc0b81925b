/**
 * The exclusive operation a move between nodes holds a session as (cluster): a message sent
 * meanwhile answers `session_moving` (retryable) rather than `session_busy`.
 */
export const MOVE_OPERATION = 'a move to another node'

/**
 * Why this process ends turns it runs itself rather than at a user's cancel (an API replica
 * stopping): the turn fails with `code`, the session with it as cause, not `cancelled`.
 */
export class TurnStop extends Error {
  constructor(
    readonly code: 'replica_stopping' | 'quota_exceeded',
    message: string,
  ) {
    super(message)
    this.name = 'TurnStop'
  }
}

export interface RunningTurn {
  turnId: string
  abort: AbortController
  done: Promise<void>
}

/**
 * The per-session turn lock: one turn (or one exclusive operation, e.g. a restore) at a time per
 * session. Whoever holds it can be cancelled through its `abort` and waited for through `done`.
 */
export class TurnLocks {
  private readonly running = new Map<string, RunningTurn>()
  /** Sessions an exclusive operation (a restore swapping the workspace…) holds, with what it is. */
  private readonly exclusiveOps = new Map<string, string>()
  /** Changes to the live workspace through the files API in flight, per session. */
  private readonly fileChanges = new Map<string, number>()
  /** How many workspace swaps (restores, imports) have started on each session. */
  private readonly swapStarts = new Map<string, number>()
  /** Sessions whose exclusive operation swaps the workspace. */
  private readonly swappingNow = new Set<string>()
  /** How many times each session's lock was taken (see `takes`). */
  private readonly takeCounts = new Map<string, number>()

  has(sessionId: string): boolean {
    return this.running.has(sessionId)
  }

  /** The sessions whose lock is held now. */
  held(): string[] {
    return [...this.running.keys()]
  }

  get(sessionId: string): RunningTurn | undefined {
    return this.running.get(sessionId)
  }

  get size(): number {
    return this.running.size
  }

  /**
   * How many times the session's lock has been taken in this process: a read of the session made
   * while it did not move saw no turn or exclusive operation of this process begin meanwhile.
   */
  takes(sessionId: string): number {
    return this.takeCounts.get(sessionId) ?? 0
  }

  /** Takes the session's lock (the caller checked it was free); the returned function releases it. */
  take(sessionId: string, turnId: string, abort: AbortController): () => void {
    this.takeCounts.set(sessionId, this.takes(sessionId) + 1)
    let release!: () => void
    const done = new Promise<void>((resolve) => {
      release = resolve
    })
    this.running.set(sessionId, { turnId, abort, done })
    return () => {
      this.running.delete(sessionId)
      release()
    }
  }

  /** Runs `fn` holding the lock, recorded as the exclusive operation `what` (see `busyWith`). */
  async holdExclusive<T>(
    sessionId: string,
    what: string,
    fn: () => Promise<T>,
    swapsWorkspace = false,
  ): Promise<T> {
    const release = this.take(sessionId, what, new AbortController())
    this.exclusiveOps.set(sessionId, what)
    if (swapsWorkspace) {
      this.swapStarts.set(sessionId, this.swapEpoch(sessionId) + 1)
      this.swappingNow.add(sessionId)
    }
    try {
      return await fn()
    } finally {
      this.swappingNow.delete(sessionId)
      this.exclusiveOps.delete(sessionId)
      release()
    }
  }

  /**
   * Moves on each time a restore or an import (an operation that swaps the workspace) starts on
   * the session: a read that saw it move met a swap, even one finished by the time it looks.
   */
  swapEpoch(sessionId: string): number {
    return this.swapStarts.get(sessionId) ?? 0
  }

  /** Whether a restore or an import holds the session now. */
  swapping(sessionId: string): boolean {
    return this.swappingNow.has(sessionId)
  }

  /** Forgets a deleted session's counters. */
  forget(sessionId: string): void {
    this.swapStarts.delete(sessionId)
    this.takeCounts.delete(sessionId)
  }

  /** The exclusive operation (e.g. "a restore") holding the session, if any. */
  busyWith(sessionId: string): string | undefined {
    return this.exclusiveOps.get(sessionId)
  }

  /** Runs `fn`, a change to the live workspace, counted so no exclusive operation starts meanwhile. */
  async holdFileChange<T>(sessionId: string, fn: () => Promise<T>): Promise<T> {
    this.fileChanges.set(sessionId, (this.fileChanges.get(sessionId) ?? 0) + 1)
    try {
      return await fn()
    } finally {
      const left = (this.fileChanges.get(sessionId) ?? 1) - 1
      if (left > 0) this.fileChanges.set(sessionId, left)
      else this.fileChanges.delete(sessionId)
    }
  }

  changingFiles(sessionId: string): boolean {
    return this.fileChanges.has(sessionId)
  }

  /** Cancels whatever holds the session's lock and waits for it to settle; false if nothing did. */
  async cancel(sessionId: string): Promise<boolean> {
    const running = this.running.get(sessionId)
    if (!running) return false
    running.abort.abort()
    await running.done
    return true
  }

  /**
   * Lets running turns finish for up to `graceMs`, then cancels what is left (`stop`: why);
   * `cutShort` aborted (a second Ctrl-C) cancels them at once.
   */
  async drain(graceMs: number, stop?: TurnStop, cutShort?: AbortSignal): Promise<void> {
    const pending = [...this.running.values()].map((r) => r.done)
    if (pending.length === 0) return
    let timer: NodeJS.Timeout | undefined
    let onAbort: (() => void) | undefined
    const timeout = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, graceMs)
      onAbort = () => resolve()
      if (cutShort?.aborted) resolve()
      cutShort?.addEventListener('abort', onAbort, { once: true })
    })
    await Promise.race([Promise.all(pending), timeout])
    if (timer) clearTimeout(timer)
    if (onAbort) cutShort?.removeEventListener('abort', onAbort)
    await this.cancelAll(stop)
  }

  /** Cancels every running turn (`stop`: as that failure) and waits for all of them to settle. */
  async cancelAll(stop?: TurnStop): Promise<void> {
    for (const running of this.running.values()) running.abort.abort(stop)
    await Promise.all([...this.running.values()].map((r) => r.done))
  }
}
