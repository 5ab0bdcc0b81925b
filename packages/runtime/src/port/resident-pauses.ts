import type { AgentProcess } from '../agent/agent-process.js'
import type { Logger } from '../util/logger.js'
import type { ResidentBounds } from './resident-bounds.js'

/** What a `pause: memory` agent's pause does besides freezing (`LocalRuntimePort.startAgent`). */
export interface PauseHooks {
  /**
   * Ends its residency (or, resident pauses off, its keep-warm window): gVisor checkpoints the
   * sandbox (which stops it), bwrap stops it and its memory is lost; `why` names the release.
   * `shutdown`: the server is stopping, so nothing is recorded in the session's events now.
   */
  release(why: string, shutdown: boolean): Promise<void>
  /**
   * Frozen in place (how long the freeze took), thawed (how long it had been frozen), or dropped
   * while frozen (an end, a delete, a fresh start: the caller stops it and says why).
   */
  resident(change: 'frozen' | 'thawed' | 'dropped', ms: number): void
}

interface Resident {
  agent: AgentProcess
  tenantId: string
  hooks: PauseHooks
  frozenAt: number
  timer: NodeJS.Timeout
  /** Its freeze completed and was reported (a thaw before that is no resume of a pause). */
  reported?: boolean
}

/**
 * Tier 1 of `pause: memory`: sandboxes frozen in place by their cgroup's freezer when keep-warm
 * ends — memory in RAM, the agent's pipes open — so the next message only thaws them. Insertion
 * order is age: the oldest is released first when `max` is reached.
 */
export class ResidentPauses {
  private readonly held = new Map<string, Resident>()

  constructor(
    readonly bounds: ResidentBounds,
    private readonly clock: { now(): number },
    private readonly logger: Logger,
  ) {}

  get enabled(): boolean {
    return this.bounds.max > 0 && this.bounds.idleMs > 0
  }

  get size(): number {
    return this.held.size
  }

  agent(sessionId: string): AgentProcess | undefined {
    return this.held.get(sessionId)?.agent
  }

  /**
   * Freezes the agent's sandbox and keeps it until `wake`, `remove` or a release (idle, room,
   * shutdown). Kept before the freeze completes, so a message that comes meanwhile thaws it.
   */
  async hold(sessionId: string, agent: AgentProcess, tenantId: string, hooks: PauseHooks): Promise<void> {
    const timer = setTimeout(
      () => void this.release(sessionId, `frozen for ${this.bounds.idleMs / 1000} s, the node's idle bound`),
      this.bounds.idleMs,
    ).unref()
    const frozenAt = this.clock.now()
    this.held.set(sessionId, { agent, tenantId, hooks, frozenAt, timer })
    const startedMs = performance.now()
    try {
      await agent.freeze()
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error)
      await this.release(sessionId, `its sandbox could not be frozen: ${message}`)
      return
    }
    const held = this.held.get(sessionId)
    if (held?.agent === agent) {
      held.reported = true
      hooks.resident('frozen', performance.now() - startedMs)
    }
    for (const oldest of this.held.keys()) {
      if (this.held.size <= this.bounds.max) break
      await this.release(
        oldest,
        `the node keeps at most ${this.bounds.max} sandboxes frozen, the oldest released first`,
      )
    }
  }

  /**
   * Thaws the session's frozen sandbox and hands it back (the caller keeps it warm). The thaw is
   * written before this returns (`cgroup.freeze`/`freezer.state`), so what the caller writes to
   * the agent next is read once the kernel has woken it.
   */
  wake(sessionId: string): { agent: AgentProcess; tenantId: string; hooks: PauseHooks } | undefined {
    const resident = this.remove(sessionId)
    if (!resident) return undefined
    void resident.agent
      .thaw()
      .catch((error: unknown) =>
        this.logger.warn({ err: error, sessionId }, 'thawing a resident sandbox failed'),
      )
    if (resident.reported) resident.hooks.resident('thawed', this.clock.now() - resident.frozenAt)
    return resident
  }

  /** Forgets the session's frozen sandbox without thawing it (the caller stops it). */
  remove(sessionId: string): Resident | undefined {
    const resident = this.held.get(sessionId)
    if (!resident) return undefined
    this.held.delete(sessionId)
    clearTimeout(resident.timer)
    return resident
  }

  /** Thaws and releases the session's frozen sandbox (`PauseHooks.release`); resolves once done. */
  private releasing = new Map<string, Promise<void>>()

  release(sessionId: string, why: string, shutdown = false): Promise<void> {
    const resident = this.remove(sessionId)
    if (!resident) return this.releasing.get(sessionId) ?? Promise.resolve()
    const done = (async () => {
      await resident.agent.thaw().catch(() => undefined)
      await resident.hooks.release(why, shutdown)
    })()
      .catch((error: unknown) =>
        this.logger.warn({ err: error, sessionId }, 'releasing a resident sandbox failed'),
      )
      .finally(() => this.releasing.delete(sessionId))
    this.releasing.set(sessionId, done)
    return done
  }

  /** Resolves once a release under way for the session, if any, is done. */
  async settled(sessionId: string): Promise<void> {
    await this.releasing.get(sessionId)
  }

  /** Releases every frozen sandbox (the server stops: gVisor checkpoints, bwrap records nothing). */
  async releaseAll(why: string): Promise<void> {
    await Promise.all([...this.held.keys()].map((id) => this.release(id, why, true)))
  }
}
