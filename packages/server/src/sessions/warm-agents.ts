import { CairnProblem } from '@cairn/protocol'
import { type AgentProcess, launchEnvironment } from '@cairn/runtime'
import { iso } from '../clock.js'
import { sandboxLimits, sessionNetwork, turnTimeoutMs } from './sandbox-settings.js'
import type { SessionServiceDeps } from './session-deps.js'
import type { SessionRow, SessionStore } from './session-store.js'
import { TranscriptCache } from './transcript-cache.js'
import type { TurnLocks } from './turn-locks.js'

export type WarmAgentsDeps = Pick<
  SessionServiceDeps,
  | 'runtime'
  | 'agents'
  | 'secrets'
  | 'memory'
  | 'metrics'
  | 'egressSite'
  | 'egressUpstreamCaPems'
  | 'clock'
  | 'logger'
  | 'operatorLimits'
> & {
  store: SessionStore
  locks: TurnLocks
  /** The problem a workspace missing from the pool stands for (see `SessionService.missingWorkspace`). */
  missingWorkspace: (tenantId: string, sessionId: string) => Promise<CairnProblem>
}

interface WarmAgent {
  agent: AgentProcess
  tenantId: string
  /** When its last turn or activity ended (epoch ms): the least recently used idle one goes first. */
  usedAt: number
  timer: NodeJS.Timeout | undefined
  /** When the cooldown timer fires (epoch ms), so activity only ever extends it. */
  until?: number | undefined
}

/**
 * The agent processes kept warm between turns: started cold on a session's first turn (or after
 * its sandbox went), reused by the next turn within the keep-warm window, stopped when it cools.
 * What is cached per warm sandbox (the transcript, the activity throttle) goes with it.
 */
export class WarmAgents {
  private readonly warm = new Map<string, WarmAgent>()
  /** Sessions admitted for a cold start whose sandbox is not up yet, with their tenant. */
  private readonly starting = new Map<string, string>()
  private readonly activityWrittenAt = new Map<string, number>()
  readonly transcripts: TranscriptCache

  constructor(private readonly deps: WarmAgentsDeps) {
    this.transcripts = new TranscriptCache(deps.store)
  }

  has(sessionId: string): boolean {
    return this.warm.has(sessionId)
  }

  agent(sessionId: string): AgentProcess | undefined {
    return this.warm.get(sessionId)?.agent
  }

  get size(): number {
    return this.warm.size
  }

  /**
   * Makes room for this session's sandbox under its tenant's cap (`maxSandboxesPerTenant`): when
   * the tenant is at the cap, its least recently used idle sandboxes are stopped (their sessions
   * stay idle and start cold next time, as after the keep-warm window); when every one is running
   * a turn, `sandbox_limit_reached` (retryable). Synchronous, so concurrent messages cannot pass
   * the cap together. The answer releases the slot once the sandbox is up (or the turn is over).
   */
  admit(row: SessionRow, busy: (sessionId: string) => boolean): () => void {
    if (this.warm.get(row.id)?.agent.alive) return () => undefined
    const cap = this.deps.operatorLimits.maxSandboxesPerTenant
    const tenant = row.tenant_id
    const running = () => {
      let n = 0
      for (const [id, warm] of this.warm) if (warm.tenantId === tenant && id !== row.id) n++
      for (const [id, owner] of this.starting) if (owner === tenant && id !== row.id) n++
      return n
    }
    if (running() >= cap) {
      const idle = [...this.warm]
        .filter(([id, warm]) => warm.tenantId === tenant && id !== row.id && !busy(id))
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
    this.starting.set(row.id, tenant)
    return () => {
      if (this.starting.get(row.id) === tenant) this.starting.delete(row.id)
    }
  }

  /** The session's warm agent (its cooldown stopped while a turn uses it), or a freshly started one. */
  async acquire(row: SessionRow): Promise<{ agent: AgentProcess; cold: boolean }> {
    const warm = this.warm.get(row.id)
    if (warm?.agent.alive) {
      if (warm.timer) clearTimeout(warm.timer)
      warm.timer = undefined
      warm.until = undefined
      return { agent: warm.agent, cold: false }
    }
    if (warm) await this.drop(row.id)
    const { pool } = this.deps.runtime
    if (!(await pool.hasWorkspace(row.id))) throw await this.deps.missingWorkspace(row.tenant_id, row.id)
    const revision = await this.deps.agents.store.revision(row.revision_id)
    if (!revision) throw new CairnProblem('revision_not_found', `revision ${row.revision_id} is gone`)
    const envKey = revision.manifest.envKey ?? undefined
    const proxySecrets = await this.deps.secrets.proxySecrets(row.tenant_id, row.agent_id)
    const launch = launchEnvironment(this.deps.agents.envs.dependency(envKey), {
      ...(await this.deps.secrets.valuesForScope(row.tenant_id, row.agent_id, 'runtime')),
      // A proxy secret's variable holds only its stand-in; the egress proxy swaps in the value.
      ...Object.fromEntries(proxySecrets.map((secret) => [secret.name, secret.standIn])),
    })
    const agent = await this.deps.runtime.startAgent({
      sessionId: row.id,
      workspaceDir: pool.workspacePath(row.id),
      command: revision.command,
      protocol: revision.manifest.protocol ?? 'stdio',
      env: launch.env,
      binds: [...launch.binds, ...(this.deps.memory ? [await this.deps.memory.bind(row.agent_id)] : [])],
      egress: {
        ...this.deps.egressSite,
        policy: sessionNetwork(row, revision.manifest),
        onEvent: (event) => {
          void this.deps.store
            .recordNetwork(row.id, event)
            .catch((error: unknown) =>
              this.deps.logger.warn({ err: error, session: row.id }, 'recording a network event failed'),
            )
        },
        secrets: proxySecrets,
        upstreamCaPems: this.deps.egressUpstreamCaPems,
      },
      limits: sandboxLimits(revision.manifest, this.deps.operatorLimits),
      turnTimeoutMs: turnTimeoutMs(revision.manifest, this.deps.operatorLimits),
      isolation: revision.manifest.isolation,
    })
    this.warm.set(row.id, { agent, tenantId: row.tenant_id, usedAt: Date.now(), timer: undefined })
    this.starting.delete(row.id)
    this.deps.metrics?.coldStarts.inc()
    return { agent, cold: true }
  }

  /** After a turn: the sandbox stays warm for the session's keep-warm window, then stops. */
  scheduleCooldown(row: SessionRow): void {
    const warm = this.warm.get(row.id)
    if (!warm) return
    warm.usedAt = Date.now()
    if (row.keep_warm_ms <= 0) {
      void this.drop(row.id)
      return
    }
    warm.until = Date.now() + row.keep_warm_ms
    warm.timer = setTimeout(() => {
      if (this.deps.locks.has(row.id)) return
      void this.drop(row.id)
    }, row.keep_warm_ms)
    warm.timer.unref()
  }

  /** Moves a cooling warm sandbox's stop to at least `ms` from now (never earlier). */
  extend(id: string, ms: number): void {
    const warm = this.warm.get(id)
    if (!warm?.timer) return
    const until = Date.now() + ms
    if (warm.until !== undefined && warm.until >= until) return
    clearTimeout(warm.timer)
    warm.until = until
    warm.timer = setTimeout(() => {
      if (this.deps.locks.has(id)) return
      void this.drop(id)
    }, ms)
    warm.timer.unref()
  }

  /**
   * Activity that is not a turn (a preview request): the idle clock restarts and a warm sandbox
   * stays warm for its keep-warm window. The database write is throttled to once a second.
   */
  noteActivity(row: SessionRow): void {
    const now = this.deps.clock.now()
    if (now - (this.activityWrittenAt.get(row.id) ?? 0) >= 1000) {
      this.activityWrittenAt.set(row.id, now)
      void this.deps.store
        .touch(row.id, iso(now))
        .catch((error: unknown) =>
          this.deps.logger.warn({ err: error, session: row.id }, 'recording session activity failed'),
        )
    }
    const warm = this.warm.get(row.id)
    if (warm) warm.usedAt = Date.now()
    this.extend(row.id, row.keep_warm_ms)
  }

  async drop(sessionId: string): Promise<void> {
    this.transcripts.forget(sessionId)
    this.activityWrittenAt.delete(sessionId)
    const warm = this.warm.get(sessionId)
    if (!warm) return
    this.warm.delete(sessionId)
    if (warm.timer) clearTimeout(warm.timer)
    await this.deps.runtime.stopAgent(warm.agent)
  }

  async dropAll(): Promise<void> {
    await Promise.all([...this.warm.keys()].map((id) => this.drop(id)))
  }
}
