import type { Logger } from 'pino'

export interface SelfFenceDeps {
  /** Stops every sandbox on the node (the runtime port's `stopAllAgents`). */
  stopAllAgents: () => Promise<void>
  logger: Logger
  /** Told when the node fences itself, and when it is live again. */
  onChange?: ((fenced: boolean, reason: string) => void) | undefined
}

/**
 * The node's side of liveness: it holds a lease it renews; when it could not renew before the
 * lease would end, it stops every sandbox and refuses port calls (`isFenced()`) until it has
 * registered again. Measured by this process's monotonic clock from when the last successful
 * renewal was sent, so the node gives up no later than the database's lease ends.
 */
export class SelfFence {
  private deadline: NodeJS.Timeout | undefined
  private fenced = true
  private stopping: Promise<void> | undefined

  constructor(
    private readonly leaseMs: number,
    private readonly deps: SelfFenceDeps,
  ) {}

  /** Whether the node must refuse work (fenced, or not yet registered). */
  isFenced(): boolean {
    return this.fenced
  }

  /**
   * A renewal (or registration) sent at `sentAtMs` (`performance.now()`) succeeded: the node is
   * live until `sentAtMs + leaseMs`.
   */
  renewed(sentAtMs: number): void {
    const remainingMs = sentAtMs + this.leaseMs - performance.now()
    if (remainingMs <= 0) {
      // Too late to count: the lease may already have ended in the database's eyes.
      this.fence('a renewal succeeded only after the lease would have ended')
      return
    }
    if (this.deadline) clearTimeout(this.deadline)
    this.deadline = setTimeout(() => this.fence('could not renew the lease before it ended'), remainingMs)
    if (this.fenced) {
      this.fenced = false
      this.deps.onChange?.(false, 'registered')
    }
  }

  /** Fences now: every sandbox stops; resolves once they have. */
  fence(reason: string): Promise<void> {
    if (this.deadline) clearTimeout(this.deadline)
    this.deadline = undefined
    if (!this.fenced) {
      this.fenced = true
      this.deps.logger.error({ reason }, 'node fenced: stopping every sandbox until it registers again')
      this.deps.onChange?.(true, reason)
      this.stopping = this.deps
        .stopAllAgents()
        .catch((error: unknown) =>
          this.deps.logger.error({ err: error }, 'fencing could not stop every sandbox'),
        )
    }
    return this.stopping ?? Promise.resolve()
  }

  /** Ends the timer (a clean shutdown); the node counts as fenced from now. */
  close(): void {
    if (this.deadline) clearTimeout(this.deadline)
    this.deadline = undefined
    this.fenced = true
  }
}
