import { CairnProblem, resolvePersistPaths } from '@cairn/protocol'
import type { AgentInfo } from '@cairn/runtime/port'
import { iso } from '../clock.js'
import { sessionPause } from '../pause/pause-policy.js'
import type { WorkspaceGenerations } from './generations.js'
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
  | 'egressUpstreamCaPems'
  | 'clock'
  | 'logger'
  | 'operatorLimits'
  | 'setup'
  | 'routing'
> & {
  store: SessionStore
  locks: TurnLocks
  /** The problem a workspace missing from the pool stands for (see `SessionService.missingWorkspace`). */
  missingWorkspace: (tenantId: string, sessionId: string) => Promise<CairnProblem>
}

/** A sandbox a turn's end left warm is taken as warm until this long before its keep-warm ends. */
const HINT_MARGIN_MS = 1000
/** What a replica remembers of its turns' ends at most (sessions; the least recently told go first). */
const HINTS_MAX = 10_000

/** A message waiting for a sandbox slot asks again after this, then twice as long each time… */
const ADMIT_RETRY_FIRST_MS = 25
/** …up to this. */
const ADMIT_RETRY_MAX_MS = 250

/** Resolves after `ms`, or at once when `signal` aborts. */
function delay(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms)
    function done() {
      clearTimeout(timer)
      signal?.removeEventListener('abort', done)
      resolve()
    }
    signal?.addEventListener('abort', done, { once: true })
  })
}

/**
 * What was asked of the runtime about the session's agent just before its turn (see
 * `SessionService.verifyBeforeTurn`): the turn needs not ask again.
 */
export interface SeenAgent {
  agent: AgentInfo | undefined
  /** Not asked: the agent as the last turn's end on this replica left it (`WarmAgents.hint`). */
  hinted?: true
}

/** What a turn's end said of its session's sandbox: alive, cooling down until `untilMs`. */
interface AgentHint {
  agent: AgentInfo
  ownerEpoch: number
  untilMs: number
}

/**
 * The session side of the warm agents: what a session's agent is started with (its revision,
 * secrets, memory, network), and what is cached per warm sandbox (the transcript, the activity
 * throttle). The pool itself (keep-warm windows, the per-tenant cap) is the runtime's, behind the
 * port.
 */
export class WarmAgents {
  private readonly activityWrittenAt = new Map<string, number>()
  /** Per session, when the first secret its warm agent was started with expires (ms). */
  private readonly secretsExpireAtMs = new Map<string, number>()
  /** Per session, its sandbox as its last turn's end here left it (API replicas only). */
  private readonly hints = new Map<string, AgentHint>()
  readonly transcripts: TranscriptCache

  constructor(private readonly deps: WarmAgentsDeps) {
    this.transcripts = new TranscriptCache(deps.store)
  }

  async has(sessionId: string): Promise<boolean> {
    return (await this.deps.runtime.agent(sessionId)) !== undefined
  }

  agent(sessionId: string): Promise<AgentInfo | undefined> {
    return this.deps.runtime.agent(sessionId)
  }

  /**
   * On an API replica, the session's sandbox as its last turn's end through this replica left it
   * (alive and cooling down), while its keep-warm window runs, with the owner epoch that turn ran
   * under (the caller compares it with the session's): the next message takes it as seen instead
   * of asking the node (a
   * round trip and a wake-up of the node before every turn). It may be gone all the same (stopped
   * through another replica, evicted by the tenant's cap, crashed): the turn's resume then finds
   * none and the turn starts one as a cold message would (`restart`).
   */
  hint(sessionId: string): { agent: AgentInfo; ownerEpoch: number } | undefined {
    const hint = this.hints.get(sessionId)
    if (!hint || hint.untilMs > this.deps.clock.now()) return hint
    this.hints.delete(sessionId)
    return undefined
  }

  /** What a turn's end said of the session's sandbox (none: it was stopped), for `hint`. */
  noteTurnEnd(row: SessionRow, agent: AgentInfo | undefined): void {
    this.hints.delete(row.id)
    if (!this.deps.routing || !agent?.alive || row.keep_warm_ms <= HINT_MARGIN_MS) return
    const untilMs = this.deps.clock.now() + row.keep_warm_ms - HINT_MARGIN_MS
    this.hints.set(row.id, { agent, ownerEpoch: Number(row.owner_epoch), untilMs })
    if (this.hints.size > HINTS_MAX) this.hints.delete(this.hints.keys().next().value as string)
  }

  size(): Promise<number> {
    return this.deps.runtime.warmCount()
  }

  /**
   * Makes room for this session's sandbox under its tenant's cap (`maxSandboxesPerTenant`), see
   * `RuntimePort.admitAgent`. The answer releases the slot once the sandbox is up (or the turn is over).
   * While every one of the tenant's sandboxes runs a turn, the message waits for one to end (asking
   * again at growing intervals, up to `ADMIT_RETRY_MAX_MS`) for at most `sandboxWaitMs`, then is
   * refused `sandbox_limit_reached`; a cancel (`signal`) ends the wait with that refusal too.
   */
  async admit(row: SessionRow, seen?: SeenAgent, signal?: AbortSignal): Promise<() => Promise<void>> {
    const agent = seen ? seen.agent : await this.deps.runtime.agent(row.id)
    if (agent?.alive) return async () => undefined
    const deadline = Date.now() + this.deps.operatorLimits.sandboxWaitMs
    for (let retryMs = ADMIT_RETRY_FIRST_MS; ; retryMs = Math.min(retryMs * 2, ADMIT_RETRY_MAX_MS)) {
      try {
        return await this.deps.runtime.admitAgent({
          sessionId: row.id,
          tenantId: row.tenant_id,
          maxSandboxesPerTenant: this.deps.operatorLimits.maxSandboxesPerTenant,
          busy: this.deps.locks.held(),
        })
      } catch (error) {
        const full = error instanceof CairnProblem && error.code === 'sandbox_limit_reached'
        if (!full || Date.now() + retryMs > deadline) throw error
        await delay(retryMs, signal)
        if (signal?.aborted)
          throw new CairnProblem(
            'sandbox_limit_reached',
            `${error.message} (the message was cancelled while it waited for one; nothing ran)`,
            error.details,
          )
      }
    }
  }

  /**
   * Starts the session's agent after a turn's resume found none alive although one was seen (just
   * before the turn, or as the last turn's end left it): as a message that saw it cold does,
   * under the tenant's sandbox cap (the admission released once it is up) and, when no sandbox was
   * there at all (`stopped` false), after the workspace's check (`state_lost` for one rolled back
   * or gone: inside a turn already begun, the turn's end records the session's failure).
   */
  async restart(
    row: SessionRow,
    stopped: boolean,
    generations: WorkspaceGenerations,
    signal: AbortSignal,
  ): Promise<{ agent: AgentInfo; cold: boolean }> {
    const release = await this.admit(row, { agent: undefined }, signal)
    try {
      if (!stopped)
        await generations.verify({ id: row.id, status: 'failed', status_cause: 'state_lost' }, () => false)
      return await this.start(row, false, signal)
    } finally {
      await release()
    }
  }

  /**
   * Starts the session's agent (no warm one is alive: a turn's `resume` answered `cold`, or the
   * session's agent was just seen down). `deadLeft`: a dead agent may still be there (it is
   * dropped first, with what is cached for it).
   */
  async start(
    row: SessionRow,
    deadLeft: boolean,
    signal?: AbortSignal,
  ): Promise<{ agent: AgentInfo; cold: boolean }> {
    if (deadLeft && (await this.deps.runtime.agent(row.id))) await this.drop(row.id)
    if (!(await this.deps.runtime.hasWorkspace(row.id)))
      throw await this.deps.missingWorkspace(row.tenant_id, row.id)
    // Maintenance (`session.resume`) on a workspace a turn has run on, before the agent starts.
    await this.deps.setup?.resume.runIfDue(row, signal)
    const revision = await this.deps.agents.store.revision(row.revision_id)
    if (!revision) throw new CairnProblem('revision_not_found', `revision ${row.revision_id} is gone`)
    const proxySecrets = await this.deps.secrets.proxySecrets(row.tenant_id, row.agent_id)
    const expiresAt = await this.deps.secrets.firstExpiry(row.tenant_id, row.agent_id, ['runtime', 'proxy'])
    if (expiresAt === null) this.secretsExpireAtMs.delete(row.id)
    else this.secretsExpireAtMs.set(row.id, Date.parse(expiresAt))
    const agent = await this.deps.runtime.startAgent({
      sessionId: row.id,
      tenantId: row.tenant_id,
      command: revision.command,
      protocol: revision.manifest.protocol ?? 'stdio',
      http: revision.manifest.http,
      dependencyEnvKey: revision.manifest.envKey ?? undefined,
      env: {
        ...(await this.deps.secrets.valuesForScope(row.tenant_id, row.agent_id, 'runtime')),
        // A proxy secret's variable holds only its stand-in; the egress proxy swaps in the value.
        ...Object.fromEntries(proxySecrets.map((secret) => [secret.name, secret.standIn])),
      },
      memoryAgentId: this.deps.memory ? await this.deps.memory.publish(row.agent_id) : undefined,
      persist: resolvePersistPaths(revision.manifest.persist).map((p) => p.sandboxPath),
      imageKey: this.deps.agents.images.imageKeyOf(revision),
      // Its decisions reach the session's network log through the port's `RuntimeEvents`.
      egress: {
        policy: sessionNetwork(row, revision.manifest),
        secrets: proxySecrets,
        upstreamCaPems: this.deps.egressUpstreamCaPems,
      },
      limits: sandboxLimits(revision.manifest, this.deps.operatorLimits),
      turnTimeoutMs: turnTimeoutMs(revision.manifest, this.deps.operatorLimits),
      isolation: revision.manifest.isolation,
      pause: await sessionPause(row, revision.manifest, this.deps.store),
    })
    if (!agent.restored) this.deps.metrics?.coldStarts.inc()
    return { agent, cold: !agent.restored }
  }

  /** After a turn: the sandbox stays warm for the session's keep-warm window, then stops. */
  scheduleCooldown(row: SessionRow): Promise<void> {
    return this.deps.runtime.coolDown(row.id, row.keep_warm_ms)
  }

  /** Moves a cooling warm sandbox's stop to at least `ms` from now (never earlier). */
  extend(id: string, ms: number): Promise<void> {
    return this.deps.runtime.keepWarm(id, ms)
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
    void this.deps.runtime
      .keepWarm(row.id, row.keep_warm_ms, true)
      .catch((error: unknown) =>
        this.deps.logger.warn({ err: error, session: row.id }, 'keeping a sandbox warm failed'),
      )
  }

  /** Forgets what is cached for the session's sandbox (the runtime stopped it). */
  /**
   * Whether a secret the session's warm agent was started with has expired since: its environment
   * still holds it, so the next turn starts a new sandbox without it (an expired secret is never
   * handed to a turn).
   */
  secretsExpired(sessionId: string): boolean {
    const atMs = this.secretsExpireAtMs.get(sessionId)
    return atMs !== undefined && atMs <= this.deps.clock.now()
  }

  forget(sessionId: string): void {
    this.hints.delete(sessionId)
    this.transcripts.forget(sessionId)
    this.activityWrittenAt.delete(sessionId)
    this.secretsExpireAtMs.delete(sessionId)
  }

  async drop(sessionId: string): Promise<void> {
    this.forget(sessionId)
    await this.deps.runtime.stopAgent(sessionId)
  }

  async dropAll(): Promise<void> {
    await this.deps.runtime.stopAllAgents()
  }
}
