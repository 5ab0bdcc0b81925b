import { CairnProblem } from '@cairn/protocol'
import type { AgentProcess } from '../agent/agent-process.js'
import type { PauseHooks, ResidentPauses } from './resident-pauses.js'

/** Milliseconds since the epoch; injected so the pool's idea of time can be set in tests. */
export interface PoolClock {
  now(): number
}

interface WarmAgent {
  agent: AgentProcess
  tenantId: string
  /** When its last turn or activity ended (epoch ms): the least recently used idle one goes first. */
  usedAt: number
  timer: NodeJS.Timeout | undefined
  /** When the cooldown timer fires (epoch ms), so activity only ever extends it. */
  until?: number | undefined
  /** Its window ran out while the session was in use: the stop waits for that use's end (`released`). */
  heldOff?: boolean | undefined
  /** `pause: memory`: frozen in place when it cools (`resident`), released by `PauseHooks.release`. */
  pause?: PauseHooks | undefined
}

/**
 * The agent processes kept warm between turns: started cold on a session's first turn (or after
 * its sandbox went), reused by the next turn within the keep-warm window, stopped when it cools.
 */
export class WarmPool {
  private readonly warm = new Map<string, WarmAgent>()
  /**
   * The warm sessions of each tenant: an admission counts and evicts among its tenant's own, so a
   * cold start costs the same beside 10 warm sandboxes or 10,000 of other tenants (it scanned them all).
   */
  private readonly byTenant = new Map<string, Set<string>>()
  /** Sessions admitted for a cold start whose sandbox is not up yet, with their tenant. */
  private readonly starting = new Map<string, string>()

  constructor(
    private readonly clock: PoolClock,
    /** Stops an agent the pool lets go of. */
    private readonly stop: (agent: AgentProcess) => Promise<void>,
    /** Whether the session is in a turn or an exclusive operation: its cooldown waits. */
    private readonly inUse: (sessionId: string) => boolean = () => false,
    /** Where `pause: memory` agents are frozen when they cool; none: they are released at once. */
    private readonly resident?: ResidentPauses,
  ) {}

  has(sessionId: string): boolean {
    return this.warm.has(sessionId)
  }

  agent(sessionId: string): AgentProcess | undefined {
    return this.warm.get(sessionId)?.agent
  }

  get size(): number {
    return this.warm.size
  }

  /** See `RuntimePort.admitAgent`. Synchronous, so concurrent messages cannot pass the cap together. */
  admit(sessionId: string, tenant: string, cap: number, busy: (sessionId: string) => boolean): () => void {
    if (this.warm.get(sessionId)?.agent.alive) return () => undefined
    const own = () => this.byTenant.get(tenant) ?? new Set<string>()
    const running = () => {
      let n = own().size - (own().has(sessionId) ? 1 : 0)
      // Only the cold starts under way: a handful, whatever the install.
      for (const [id, owner] of this.starting) if (owner === tenant && id !== sessionId) n++
      return n
    }
    if (running() >= cap) {
      const idle = [...own()]
        .filter((id) => id !== sessionId && !busy(id))
        .map((id) => [id, this.warm.get(id) as WarmAgent] as const)
        .sort(([, a], [, b]) => a.usedAt - b.usedAt)
      for (const [id] of idle) {
        if (running() < cap) break
        // Out of the count at once (drop forgets it before stopping it); the stop finishes behind.
        void this.drop(id).catch(() => undefined)
      }
    }
    const now = running()
    if (now >= cap)
      throw new CairnProblem(
        'sandbox_limit_reached',
        `this tenant has ${now} agent sandboxes running turns, the most this server allows (${cap}, CAIRN_MAX_SANDBOXES_PER_TENANT): retry when one ends`,
        { limit: 'maxSandboxesPerTenant', value: now, ceiling: cap },
      )
    this.starting.set(sessionId, tenant)
    return () => {
      if (this.starting.get(sessionId) === tenant) this.starting.delete(sessionId)
    }
  }

  /**
   * The session's warm agent if it is alive, its cooldown stopped while a turn uses it; a sandbox
   * frozen in place (a resident pause) is thawed and warm again.
   */
  take(sessionId: string): AgentProcess | undefined {
    this.wake(sessionId)
    const warm = this.warm.get(sessionId)
    if (!warm?.agent.alive) return undefined
    if (warm.timer) clearTimeout(warm.timer)
    warm.timer = undefined
    warm.until = undefined
    warm.heldOff = false
    return warm.agent
  }

  /** Thaws the session's resident sandbox, if it has one, into the pool (no cooldown scheduled). */
  wake(sessionId: string): void {
    const woken = this.resident?.wake(sessionId)
    if (woken) this.add(sessionId, woken.tenantId, woken.agent, woken.hooks)
  }

  /** The session's agent frozen in place (a resident pause), if it has one. */
  residentAgent(sessionId: string): AgentProcess | undefined {
    return this.resident?.agent(sessionId)
  }

  /** Keeps a freshly started agent; `pause` pauses it when keep-warm runs out, instead of a stop. */
  add(sessionId: string, tenantId: string, agent: AgentProcess, pause?: PauseHooks): void {
    this.forget(sessionId)
    this.warm.set(sessionId, { agent, tenantId, usedAt: this.clock.now(), timer: undefined, pause })
    let own = this.byTenant.get(tenantId)
    if (!own) {
      own = new Set()
      this.byTenant.set(tenantId, own)
    }
    own.add(sessionId)
    this.starting.delete(sessionId)
  }

  /** Takes the session out of the pool and its tenant's count (the caller stops or hands on its agent). */
  private forget(sessionId: string): WarmAgent | undefined {
    const warm = this.warm.get(sessionId)
    if (!warm) return undefined
    this.warm.delete(sessionId)
    const own = this.byTenant.get(warm.tenantId)
    own?.delete(sessionId)
    if (own?.size === 0) this.byTenant.delete(warm.tenantId)
    return warm
  }

  /** After a turn: the sandbox stays warm for `keepWarmMs`, then stops. */
  coolDown(sessionId: string, keepWarmMs: number): void {
    const warm = this.warm.get(sessionId)
    if (!warm) return
    warm.usedAt = this.clock.now()
    if (keepWarmMs <= 0) {
      void this.drop(sessionId)
      return
    }
    this.stopIn(sessionId, warm, keepWarmMs)
  }

  /**
   * Moves a cooling warm sandbox's stop to at least `ms` from now (never earlier). `activity`: the
   * session was used (a preview request), which makes it the most recently used.
   */
  extend(sessionId: string, ms: number, activity = false): void {
    const warm = this.warm.get(sessionId)
    if (!warm) return
    if (activity) warm.usedAt = this.clock.now()
    if (!warm.timer) return
    if (warm.until !== undefined && warm.until >= this.clock.now() + ms) return
    clearTimeout(warm.timer)
    this.stopIn(sessionId, warm, ms)
  }

  /**
   * Work outside a turn ended (a command): the sandbox is the most recently used, and its stop
   * moves to at least `ms` from now, scheduled if none was (a stop that came while the work ran
   * waited for it, and is due again).
   */
  rest(sessionId: string, ms: number): void {
    const warm = this.warm.get(sessionId)
    if (!warm) return
    const now = this.clock.now()
    warm.usedAt = now
    if (warm.timer && warm.until !== undefined && warm.until >= now + ms) return
    if (warm.timer) clearTimeout(warm.timer)
    if (ms <= 0) {
      void this.drop(sessionId)
      return
    }
    this.stopIn(sessionId, warm, ms)
  }

  /**
   * Work that held the session in use ended (a file write, a snapshot, a command's start): a stop
   * its keep-warm window called for meanwhile, and held off, comes now.
   */
  released(sessionId: string): void {
    const warm = this.warm.get(sessionId)
    if (!warm?.heldOff || this.inUse(sessionId)) return
    warm.heldOff = false
    void this.cool(sessionId)
  }

  private stopIn(sessionId: string, warm: WarmAgent, ms: number): void {
    warm.until = this.clock.now() + ms
    warm.heldOff = false
    warm.timer = setTimeout(() => {
      warm.heldOff = this.inUse(sessionId)
      if (!warm.heldOff) void this.cool(sessionId)
    }, ms)
    warm.timer.unref()
  }

  /** Releases under way when resident pauses are off (a checkpoint, a stop), by session (see `cool`). */
  private readonly cooling = new Map<string, Promise<void>>()

  /**
   * The end of the keep-warm window: a `pause: memory` agent is frozen in place (resident), or
   * released at once when resident pauses are off (a checkpoint under gVisor); others stop.
   */
  private async cool(sessionId: string): Promise<void> {
    const warm = this.warm.get(sessionId)
    if (!warm?.pause || !warm.agent.alive) return this.drop(sessionId)
    this.forget(sessionId)
    if (this.resident?.enabled) return this.resident.hold(sessionId, warm.agent, warm.tenantId, warm.pause)
    const cooling = warm.pause
      .release('keep-warm ended and this node keeps no sandbox frozen', false)
      .finally(() => this.cooling.delete(sessionId))
    this.cooling.set(sessionId, cooling)
    await cooling
  }

  /** Resolves once the session's release (a checkpoint being taken, a stop), if any, is done. */
  async settled(sessionId: string): Promise<void> {
    await this.cooling.get(sessionId)
    await this.resident?.settled(sessionId)
  }

  /** Forgets the session's warm (or resident, thawed) agent without stopping it (the caller ends it). */
  detach(sessionId: string): { agent: AgentProcess; tenantId: string } | undefined {
    this.wake(sessionId)
    const warm = this.forget(sessionId)
    if (!warm) return undefined
    if (warm.timer) clearTimeout(warm.timer)
    return { agent: warm.agent, tenantId: warm.tenantId }
  }

  async drop(sessionId: string): Promise<void> {
    // Forgotten at once (the tenant's count drops now); one being checkpointed is waited for.
    const resident = this.warm.has(sessionId) ? undefined : this.resident?.remove(sessionId)
    resident?.hooks.resident('dropped', this.clock.now() - resident.frozenAt)
    const warm = this.forget(sessionId) ?? resident
    if (!warm) return this.settled(sessionId)
    if (warm.timer) clearTimeout(warm.timer)
    await this.stop(warm.agent)
  }

  /** The server stops: resident sandboxes are released (gVisor checkpoints them), warm ones stop. */
  async dropAll(): Promise<void> {
    await this.resident?.releaseAll('the server stopped')
    await Promise.all([...this.warm.keys()].map((id) => this.drop(id)))
  }
}
