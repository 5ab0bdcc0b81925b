import {
  CairnProblem,
  type CreateSessionBody,
  type ErrorCode,
  newId,
  type SessionInfo,
  type SessionPolicy,
  type SessionPolicyInput,
} from '@cairn/protocol'
import type { AgentInfo } from '@cairn/runtime/port'
import { iso } from '../clock.js'
import { checkSetupTimeoutCeiling } from '../limits/ceilings.js'
import { checkSessionPause } from '../pause/pause-policy.js'
import { manifestSetup, needsSetup } from '../setup/setup-service.js'
import { WorkspaceGenerations } from './generations.js'
import { changedPolicy, createPolicy, deadlineFor, policyColumns, policyOf } from './policy.js'
import { type ReapReport, SessionReaper } from './reaper.js'
import { PoolReconciler } from './reconcile.js'
import type { SessionServiceDeps } from './session-deps.js'
import { SessionReads } from './session-reads.js'
import type { InterruptedTurn, SessionRow } from './session-store.js'
import { TurnEvents } from './turn-events.js'
import { TurnLocks, TurnStop } from './turn-locks.js'
import { type TurnHandle, TurnRunner } from './turn-runner.js'
import { type TurnReplay, TurnStreams } from './turn-stream.js'
import { type SeenAgent, WarmAgents } from './warm-agents.js'
import { WorkspaceAccess } from './workspace-access.js'

export type { SessionServiceDeps } from './session-deps.js'
export type { TurnHandle } from './turn-runner.js'
export type { TurnReplay } from './turn-stream.js'

/**
 * Sessions and their turns: one turn at a time per session, a warm agent process between turns
 * for the keep-warm window, every status change recorded with its cause. The pieces live beside
 * it: the turn lock (`turn-locks.ts`), the warm agents (`warm-agents.ts`), the turn itself
 * (`turn-runner.ts`), the policy timeouts (`reaper.ts`), the start-up check (`reconcile.ts`), the
 * reads of sessions (`session-reads.ts`, its base) and the files API's and exclusive operations'
 * way in to the workspace (`workspace-access.ts`).
 */
export class SessionService extends SessionReads {
  private readonly generations: WorkspaceGenerations
  private readonly locks = new TurnLocks()
  protected readonly warm: WarmAgents
  private readonly runner: TurnRunner
  private readonly turnEvents: TurnEvents
  private readonly turnStreams: TurnStreams
  private readonly reaper: SessionReaper
  private readonly reconciler: PoolReconciler
  /** Reads, writes and exclusive operations on the live workspace (and the deletions in progress). */
  private readonly access: WorkspaceAccess

  constructor(deps: SessionServiceDeps) {
    super(deps)
    const now = () => this.now()
    const { store, locks } = this
    this.generations = new WorkspaceGenerations(store, deps.runtime, now)
    this.warm = new WarmAgents({
      ...deps,
      store,
      locks,
      missingWorkspace: (tenantId, id) => this.missingWorkspace(tenantId, id),
    })
    this.turnEvents = new TurnEvents({
      db: deps.db,
      logger: deps.logger,
      hints: deps.hints,
      flushMs: deps.turnEventsFlushMs,
      budget: deps.storageBudget,
    })
    this.turnStreams = new TurnStreams({
      events: this.turnEvents,
      logger: deps.logger,
      pollMs: deps.turnEventsPollMs,
    })
    this.runner = new TurnRunner({
      ...deps,
      store,
      locks,
      warm: this.warm,
      generations: this.generations,
      events: this.turnEvents,
    })
    this.reaper = new SessionReaper({
      ...deps,
      store,
      locks,
      warm: this.warm,
      cancelTurn: (id) => this.cancelRunning(id),
      deleteSession: (tenantId, id, cause, detail) => this.delete(tenantId, id, cause, detail),
    })
    this.reconciler = new PoolReconciler(store, deps.runtime, this.generations, now)
    this.access = new WorkspaceAccess({
      ...deps,
      store,
      locks,
      requireLive: (tenantId, id) => this.requireLive(tenantId, id),
    })
    // Another replica asked (a cancel through it) to cancel a turn this one relays.
    deps.relays?.onCancelAsked((sessionId, turnId) => {
      if (locks.get(sessionId)?.turnId === turnId) void locks.cancel(sessionId)
    })
  }

  /** See `WorkspaceAccess.readingWorkspace`. */
  readingWorkspace<T>(tenantId: string, id: string, read: () => Promise<T>, walk = false): Promise<T> {
    return this.access.readingWorkspace(tenantId, id, read, walk)
  }

  /** The exclusive operation (e.g. "a restore") holding the session, if any. */
  busyWith(id: string): string | undefined {
    return this.locks.busyWith(id)
  }

  /** See `WorkspaceAccess.missingWorkspace`. */
  missingWorkspace(tenantId: string, id: string, swapped = false): Promise<CairnProblem> {
    return this.access.missingWorkspace(tenantId, id, swapped)
  }

  async create(tenantId: string, body: CreateSessionBody): Promise<SessionInfo> {
    const agent = await this.deps.agents.require(tenantId, body.agent)
    if (!agent.current_revision_id) {
      throw new CairnProblem('agent_not_ready', `agent '${agent.name}' has no READY revision yet`)
    }
    const missing = await this.deps.secrets.missing(
      agent.id,
      await this.deps.agents.requiredSecrets(agent.id),
    )
    if (missing.length > 0) {
      throw new CairnProblem(
        'secrets_missing',
        `agent '${agent.name}' needs secrets that are not set: ${missing.join(', ')} (cairn secrets set ${agent.name} ${missing[0]}=…)`,
        { missing },
      )
    }
    const revision = await this.deps.agents.store.revision(agent.current_revision_id)
    const setup = body.setup ?? (revision ? manifestSetup(revision.manifest) : undefined)
    if (setup && !this.deps.setup) throw new CairnProblem('bad_request', 'this server has no setup phase')
    if (body.setup)
      checkSetupTimeoutCeiling('session', 'setup.timeoutMs', body.setup.timeoutMs, this.deps.operatorLimits)
    const policy = createPolicy(body)
    if (body.pause && revision) await checkSessionPause(body.pause, revision.manifest, this.deps.runtime)
    const id = newId('session')
    await this.deps.runtime.createWorkspace(id, agent.current_revision_id, tenantId)
    await this.store.insert({
      id,
      tenant_id: tenantId,
      agent_id: agent.id,
      revision_id: agent.current_revision_id,
      title: body.title ?? null,
      status: 'idle',
      status_cause: 'created',
      ...policyColumns(policy, this.deps.clock.now()),
      auto_snapshots: body.autoSnapshots === false ? 0 : 1,
      network_json: body.network ? JSON.stringify(body.network) : null,
      ephemeral: body.ephemeral ? 1 : 0,
      keep_transcript: body.ephemeral && !body.keepTranscript ? 0 : 1,
      pause: body.pause ?? null,
      created_at: this.now(),
    })
    if (setup) await this.deps.setup?.record(id, setup)
    const created = await this.require(tenantId, id)
    for (const observer of this.observers) observer.created?.(created)
    return this.info(created)
  }

  /**
   * Validates and locks before anything is streamed, so a second message for the same session is
   * refused with `session_busy` (the turn lock here, the database's one running turn per session
   * across replicas).
   */
  beginTurn(tenantId: string, id: string, prompt: string, seen?: SeenAgent): Promise<TurnHandle> {
    return this.runner.begin(id, () => this.requireOwned(tenantId, id, this.store.getForTurn), prompt, seen)
  }

  /**
   * A message's turn: `verifyBeforeTurn`, then `beginTurn`, with the session's row read while the
   * runtime is asked about its agent (on a cluster a round trip to the node beside one to the
   * database; not asked when the last turn's end through this replica told it, see
   * `WarmAgents.hint`). That row is the check's when the agent is gone, and stands for the turn's own read
   * when the runtime had the agent (nothing was checked or written) and no turn or exclusive
   * operation of this process took the session's lock meanwhile; otherwise the turn reads it
   * under its lock, as `beginTurn` does.
   */
  async startTurn(tenantId: string, id: string, prompt: string): Promise<TurnHandle> {
    const load = () => this.requireOwned(tenantId, id, this.store.getForTurn)
    const takes = this.locks.takes(id)
    const early = load()
    early.catch(() => undefined)
    // An API replica whose last turn of the session left its sandbox warm takes that for the
    // answer (`WarmAgents.hint`): the turn's own call to the node is then the only one.
    const hint = this.locks.has(id) ? undefined : this.warm.hint(id)
    if (hint) {
      const row = await early.catch(() => undefined)
      // Under another owner epoch the session moved (or its node was lost) since: asked again.
      if (row && Number(row.owner_epoch) === hint.ownerEpoch && this.locks.takes(id) === takes)
        return this.runner.begin(id, async () => row, prompt, { agent: hint.agent, hinted: true })
    }
    const seen = await this.verifyBeforeTurn(tenantId, id, early)
    const row = seen?.agent ? await early.catch(() => undefined) : undefined
    const fresh = row !== undefined && this.locks.takes(id) === takes
    return this.runner.begin(id, fresh ? async () => row : load, prompt, seen)
  }

  /**
   * A turn's event stream picked up after event `after`, through any replica; undefined when the
   * turn ended and its terminal event is at or before `after` (nothing more will come).
   */
  async replayTurn(
    tenantId: string,
    id: string,
    turnId: string,
    after: number,
  ): Promise<TurnReplay | undefined> {
    await this.require(tenantId, id)
    const turn = await this.turnEvents.turn(id, turnId)
    if (!turn) throw new CairnProblem('not_found', `No turn '${turnId}' in session ${id}`)
    return this.turnStreams.replay(turn, after)
  }

  /**
   * Activity that is not a turn (a preview request): the idle clock restarts and a warm sandbox
   * stays warm for its keep-warm window. The database write is throttled to once a second.
   */
  noteActivity(row: SessionRow): void {
    this.warm.noteActivity(row)
  }

  private get observers() {
    return this.deps.observers ?? []
  }

  private async ended(sessionId: string): Promise<void> {
    for (const observer of this.observers) await observer.ended?.(sessionId)
  }

  /** Whether the session's lock is held (a turn or an exclusive operation runs). */
  isBusy(sessionId: string): boolean {
    return this.locks.has(sessionId)
  }

  /** The session's warm agent, if it has one. */
  warmAgent(sessionId: string): Promise<AgentInfo | undefined> {
    return this.warm.agent(sessionId)
  }

  /**
   * The session's sandbox, running: a warm one as it is, else started as a turn starts one (its
   * setup phase first if it has not run, the tenant's sandbox cap, the session's revision,
   * secrets, limits and network), held exclusively meanwhile so no turn starts a second one.
   * Used by work outside turns (commands).
   */
  async ensureSandbox(tenantId: string, id: string): Promise<SessionRow> {
    const row = await this.requireLive(tenantId, id)
    if ((await this.warm.agent(id))?.alive) return row
    return this.exclusive(tenantId, id, 'starting the sandbox', async (held) => {
      const seen = await this.warm.agent(id)
      if (seen?.alive) return held
      const setup = this.deps.setup
      const forTurn = await this.store.getForTurn(tenantId, id)
      if (setup && forTurn && needsSetup(forTurn.setup_status)) await setup.run(held)
      const release = await this.warm.admit(held, { agent: seen })
      try {
        await this.warm.start(held, seen !== undefined)
      } finally {
        await release()
      }
      return held
    })
  }

  /**
   * Whether the session's sandbox was started with a runtime or proxy secret that has expired
   * since: its memory still holds it (the next turn replaces the sandbox without it).
   */
  sandboxSecretsExpired(sessionId: string): boolean {
    return this.warm.secretsExpired(sessionId)
  }

  /** Stops the session's warm sandbox, if any (runtime state is disposable). */
  stopSandbox(sessionId: string): Promise<void> {
    return this.warm.drop(sessionId)
  }

  /** See `WorkspaceAccess.exclusive`. */
  exclusive<T>(
    tenantId: string,
    id: string,
    what: string,
    fn: (row: SessionRow) => Promise<T>,
    swapsWorkspace = false,
  ): Promise<T> {
    return this.access.exclusive(tenantId, id, what, fn, swapsWorkspace)
  }

  /** See `WorkspaceAccess.changingWorkspace`. */
  changingWorkspace<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.access.changingWorkspace(id, fn)
  }

  warmCount(): Promise<number> {
    return this.warm.size()
  }

  get runningCount(): number {
    return this.locks.size
  }

  isWarm(sessionId: string): Promise<boolean> {
    return this.warm.has(sessionId)
  }

  /** Cancels the running turn, if any, and waits for it to settle. */
  async cancel(tenantId: string, id: string): Promise<boolean> {
    await this.requireOwned(tenantId, id)
    return this.cancelRunning(id)
  }

  private async cancelRunning(id: string): Promise<boolean> {
    const { relays } = this.deps
    if (this.locks.has(id) || !relays) return this.locks.cancel(id)
    // An API replica: another replica may relay the turn (or may have died relaying it).
    return relays.cancel(id)
  }

  async end(tenantId: string, id: string): Promise<SessionInfo> {
    await this.requireLive(tenantId, id)
    await this.cancelRunning(id)
    await this.warm.drop(id)
    const current = await this.require(tenantId, id)
    if (current.ephemeral) {
      // Nothing of an ephemeral session stays on disk; its transcript only when asked for.
      await this.delete(tenantId, id, 'ephemeral_end')
      if (!current.keep_transcript) await this.store.deleteTranscript(id)
      return this.get(tenantId, id)
    }
    if (current.status !== 'completed')
      await this.store.transition(current, 'completed', 'user_end', this.now())
    await this.ended(id)
    return this.get(tenantId, id)
  }

  /**
   * Brings an ended, failed or timed-out session back (its workspace checked against the recorded
   * generation first), with `policy` changes applied; the `maxDurationMs` clock restarts.
   */
  async resume(tenantId: string, id: string, policy?: SessionPolicyInput): Promise<SessionInfo> {
    const row = await this.requireLive(tenantId, id)
    if (!(await this.deps.runtime.hasWorkspace(id))) throw await this.missingWorkspace(tenantId, id)
    await this.verifyWorkspace(row)
    await this.updatePolicy(row, policy, true)
    if (row.status !== 'idle' && row.status !== 'active')
      await this.store.transition(row, 'idle', 'user_resume', this.now())
    await this.store.touch(id, this.now())
    return this.get(tenantId, id)
  }

  /**
   * Applies policy changes (resume, restore). Refuses, changing nothing, a policy whose `maxTurns`
   * the session has already used up. `restartClock`: the `maxDurationMs` clock starts again now
   * (otherwise only when `maxDurationMs` itself changes).
   */
  async updatePolicy(
    row: SessionRow,
    input: SessionPolicyInput | undefined,
    restartClock: boolean,
  ): Promise<void> {
    const before = policyOf(row)
    const policy = this.validatePolicy(row, input)
    const nowMs = this.deps.clock.now()
    const deadline =
      restartClock || input?.maxDurationMs !== undefined ? deadlineFor(policy, nowMs) : row.deadline_at
    await this.store.setPolicy(row.id, policy, deadline, iso(nowMs))
    const changed = (Object.keys(policy) as (keyof typeof policy)[]).filter((k) => policy[k] !== before[k])
    if (changed.length > 0) {
      await this.store.transition(
        row,
        row.status,
        'policy_changed',
        iso(nowMs),
        changed.map((k) => `${k}: ${before[k]} → ${policy[k]}`).join(', '),
      )
    }
  }

  /** The policy `input` would give the session; refuses one whose `maxTurns` is already used up. */
  validatePolicy(row: SessionRow, input: SessionPolicyInput | undefined): SessionPolicy {
    return changedPolicy(row, input)
  }

  /**
   * Checks, before a sandbox uses it, that the workspace on disk is not older than the last
   * generation recorded: a subvolume rolled back or replaced behind Cairn's back is refused with
   * `state_lost` (and the session marked failed, with the reason in its events) instead of being
   * used quietly. A warm sandbox already holds its workspace, so it is not checked again.
   */
  async verifyWorkspace(row: SessionRow): Promise<void> {
    if (await this.warm.has(row.id)) return
    await this.generations.verify(row, () => this.locks.has(row.id))
  }

  /**
   * Before a message: the workspace check of a session whose sandbox is not warm. Answers what it
   * saw of the session's agent (for `beginTurn`, so a turn asks its runtime once); undefined when
   * it did not ask (the session is busy).
   */
  async verifyBeforeTurn(
    tenantId: string,
    id: string,
    read?: Promise<SessionRow>,
  ): Promise<SeenAgent | undefined> {
    // A warm or busy session has nothing to check here (and `beginTurn` reads the row, refusing
    // what this caller may not see): a warm turn reads the session once, not twice.
    if (this.locks.has(id)) return undefined
    const seen: SeenAgent = { agent: await this.warm.agent(id) }
    if (seen.agent) return seen
    const row = await (read ?? this.requireOwned(tenantId, id))
    if (row.status === 'deleted' || this.locks.has(id)) return seen
    await this.generations.verify(row, () => this.locks.has(row.id))
    return seen
  }

  /**
   * Records a fork: a new idle session of the parent's agent and revision whose workspace (made by
   * the caller from `fork.snapshotId`, at `child.generation`) and transcript, up to
   * `fork.turnsUpTo`, are the parent's. The only place a session row is written besides `create`.
   */
  async insertFork(
    parent: SessionRow,
    child: { id: string; title?: string | undefined; policy: SessionPolicy; generation: number },
    fork: { snapshotId: string; turnsUpTo: number },
  ): Promise<void> {
    await this.store.insert(
      {
        id: child.id,
        tenant_id: parent.tenant_id,
        agent_id: parent.agent_id,
        revision_id: parent.revision_id,
        title: child.title ?? (parent.title ? `${parent.title} (fork)` : null),
        status: 'idle',
        status_cause: 'forked',
        ...policyColumns(child.policy, this.deps.clock.now()),
        auto_snapshots: parent.auto_snapshots,
        pause: parent.pause,
        generation: child.generation,
        created_at: this.now(),
      },
      { parentId: parent.id, ...fork },
    )
  }

  /** Records the workspace's new generation (a restore or an import swapped it in, marker first). */
  async setGeneration(sessionId: string, generation: number): Promise<void> {
    await this.store.setGeneration(sessionId, generation)
  }

  /** Records what happened to the session's workspace (a restore, an import), its status unchanged. */
  async recordWorkspaceEvent(
    row: SessionRow,
    cause: 'workspace_restored' | 'workspace_imported' | 'workspace_merged',
    detail: string,
  ): Promise<void> {
    await this.store.transition(row, row.status, cause, this.now(), detail)
  }

  /** The session was used outside a turn (its files changed through the API). */
  async touch(sessionId: string): Promise<void> {
    await this.store.touch(sessionId, this.now())
  }

  /** Moves the workspace's generation forward (a file written or deleted through the API). */
  advanceGeneration(sessionId: string): Promise<number> {
    return this.generations.advance(sessionId)
  }

  async delete(
    tenantId: string,
    id: string,
    cause: 'user_delete' | 'retention' | 'ephemeral_end' | 'idle_timeout' | 'max_duration' = 'user_delete',
    detail?: string,
  ): Promise<void> {
    const row = await this.requireOwned(tenantId, id)
    if (row.status === 'deleted') return
    // A second delete of the same session waits for the first instead of racing it in the pool.
    const inFlight = this.access.deleting.get(id)
    if (inFlight) return inFlight
    const work = (async () => {
      await this.cancelRunning(id)
      // What this process held is cancelled and released by now: a live hold is another
      // replica's operation (a restore swapping the workspace), not to be deleted under.
      const heldElsewhere = await this.store.heldFor(id, this.now())
      if (heldElsewhere)
        throw new CairnProblem(
          'session_busy',
          `session ${id} is busy with ${heldElsewhere}; retry when it is done`,
        )
      await this.warm.drop(id)
      await this.deps.runtime.deleteWorkspace(id)
      for (const observer of this.observers) await observer.deleted?.(id)
      await this.store.transition(await this.require(tenantId, id), 'deleted', cause, this.now(), detail)
      // Every deletion (DELETE, retention, an ephemeral end or timeout) ends here: no stream of
      // a deleted session is resumed, so its stored events go with it.
      await this.store.deleteTurnEvents(id)
      await this.ended(id)
    })()
    this.access.deleting.set(id, work)
    try {
      await work
    } finally {
      this.access.deleting.delete(id)
      this.locks.forget(id)
    }
  }

  /** Marks what a crashed predecessor left running; called once at start. */
  async recover(): Promise<{ sessions: number; turns: InterruptedTurn[] }> {
    await this.store.claimUnowned()
    return this.store.recoverAfterRestart(this.now())
  }

  /** Reaps idle and expired sessions every `intervalMs`, then runs `more` (other services' sweeps). */
  startReaper(intervalMs: number, more?: () => Promise<unknown>): void {
    this.reaper.start(intervalMs, more)
  }

  /**
   * One sweep of idle timeouts and deadlines, without the timers of `startReaper`: what a
   * cluster's leader runs for the sessions of every node (`--role api`).
   */
  async sweep(): Promise<void> {
    await this.reaper.reapDue()
  }

  /**
   * One pass over the sessions due now: idle past their idle timeout, or past their
   * `maxDurationMs` (a running turn is cancelled); each times out.
   */
  reap(): Promise<ReapReport> {
    return this.reaper.reapDue()
  }

  /**
   * An explicit lease ("the orchestrator is thinking"): the session counts as active until it
   * expires, the idle timeout does not fire, and a warm sandbox stays warm at least that long.
   */
  async lease(
    tenantId: string,
    id: string,
    ttlMs: number,
  ): Promise<{ sessionId: string; leaseUntil: string }> {
    const row = await this.requireLive(tenantId, id)
    const now = this.deps.clock.now()
    const until = iso(now + ttlMs)
    await this.store.setLease(id, until, iso(now))
    await this.warm.extend(id, Math.max(ttlMs, row.keep_warm_ms))
    return { sessionId: id, leaseUntil: until }
  }

  /**
   * Lets running turns finish for up to `graceMs` (or until `cutShort`, a second Ctrl-C), then
   * cancels what is left: on a single server `cancelled`; an API replica's fail
   * `replica_stopping` (their agents told to stop), so a turn is never left running by a replica
   * that stopped.
   */
  drain(graceMs: number, cutShort?: AbortSignal): Promise<void> {
    const stop = this.deps.relays
      ? new TurnStop(
          'replica_stopping',
          `the API replica relaying this turn was stopped and the turn outlasted its shutdown grace (${graceMs} ms); send the message again`,
        )
      : undefined
    return this.locks.drain(graceMs, stop, cutShort)
  }

  /**
   * Checks the pool against the database at start: finishes interrupted restores, marks sessions
   * whose workspace is gone (loudly, `state_lost`), and removes subvolumes nothing refers to.
   */
  reconcile(liveSnapshotIds: Set<string>): Promise<{ lost: string[]; orphans: string[] }> {
    return this.reconciler.reconcile(liveSnapshotIds)
  }

  async close(): Promise<void> {
    this.reaper.stop()
    await this.locks.cancelAll()
    await this.warm.dropAll()
  }
}

export type { ErrorCode }
