const turnKey = (sessionId: string, turnId: string) => `${sessionId}/${turnId}`
/**
 * How long a cancel of a turn not running here yet is remembered: the turn may still be on its
 * way (its sandbox starting, or the call not arrived) and then starts cancelled.
 */
const EARLY_CANCEL_KEEP_MS = 10 * 60 * 1000

/**
 * What uses a session's sandbox or workspace on this node: its running turns (what `cancelTurn`
 * aborts), cancels of turns not running yet, and calls under way (a snapshot, a restore, a setup
 * command, a file written). The warm pool's cooldown waits while any does (the runtime decides
 * this alone: a node cannot ask the API).
 */
export class SessionUse {
  /** Turns running, by `turnKey`: what `cancelTurn` aborts. */
  private readonly turns = new Map<string, AbortController>()
  /** Cancels of turns that were not running yet, by `turnKey`: when each is forgotten (ms). */
  private readonly earlyCancels = new Map<string, number>()
  /** Calls under way that use a session's sandbox or workspace, by session: its cooldown waits. */
  private readonly calls = new Map<string, number>()

  constructor(
    /** Whether a command runs in the session's sandbox (it counts as use too). */
    private readonly commandRunning: (sessionId: string) => boolean,
    /** Told when the last call of a session ends (the pool's held-off cooldown may stop it now). */
    private readonly released: (sessionId: string) => void,
  ) {}

  /**
   * Whether the session is in use on this node: a turn of it runs, a command runs in its
   * sandbox, or a call that uses its sandbox or workspace is under way.
   */
  inUse(sessionId: string): boolean {
    if ((this.calls.get(sessionId) ?? 0) > 0) return true
    if (this.commandRunning(sessionId)) return true
    const prefix = `${sessionId}/`
    for (const key of this.turns.keys()) if (key.startsWith(prefix)) return true
    return false
  }

  /** Runs `fn` with the session counted as in use (see `inUse`). */
  async using<T>(sessionId: string, fn: () => Promise<T>): Promise<T> {
    this.calls.set(sessionId, (this.calls.get(sessionId) ?? 0) + 1)
    try {
      return await fn()
    } finally {
      const left = (this.calls.get(sessionId) ?? 1) - 1
      if (left > 0) this.calls.set(sessionId, left)
      else {
        this.calls.delete(sessionId)
        this.released(sessionId)
      }
    }
  }

  /**
   * Registers a turn as running: its controller, aborted at once when its cancel came first.
   * `ended` forgets it (only if it is still this controller).
   */
  turnStarted(sessionId: string, turnId: string): { controller: AbortController; ended: () => void } {
    const key = turnKey(sessionId, turnId)
    const controller = new AbortController()
    this.turns.set(key, controller)
    if (this.earlyCancels.delete(key)) controller.abort()
    return {
      controller,
      ended: () => {
        if (this.turns.get(key) === controller) this.turns.delete(key)
      },
    }
  }

  /** Aborts the turn, or remembers its cancel for a while when it does not run here yet. */
  cancelTurn(sessionId: string, turnId: string): void {
    const key = turnKey(sessionId, turnId)
    const running = this.turns.get(key)
    if (running) {
      running.abort()
      return
    }
    // Asked before the turn runs here (its sandbox still starting, or its call from an API
    // replica not arrived yet): it starts cancelled instead of running on unstopped.
    const nowMs = Date.now()
    for (const [early, untilMs] of this.earlyCancels) if (untilMs < nowMs) this.earlyCancels.delete(early)
    this.earlyCancels.set(key, nowMs + EARLY_CANCEL_KEEP_MS)
  }
}
