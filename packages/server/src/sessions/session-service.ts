import { randomUUID } from 'node:crypto'
import {
  CairnProblem,
  type CreateSessionBody,
  type ErrorCode,
  type Message,
  type NetworkEventInfo,
  newId,
  type SessionInfo,
  type SessionList,
  type SessionPolicy,
  type SessionPolicyInput,
  type SessionStatus,
  type StatusEvent,
  type TurnInfo,
} from '@cairn/protocol'
import type { AgentInfo } from '@cairn/runtime/port'
import { iso } from '../clock.js'
import { checkSetupTimeoutCeiling } from '../limits/ceilings.js'
import { checkSessionPause } from '../pause/pause-policy.js'
import { manifestSetup, needsSetup } from '../setup/setup-service.js'
import { decodeCursor, encodeCursor } from './cursor.js'
import { WorkspaceGenerations } from './generations.js'
import { releaseHold } from './hold-release.js'
import { changedPolicy, createPolicy, deadlineFor, policyColumns, policyOf } from './policy.js'
import { type ReapReport, SessionReaper } from './reaper.js'
import { PoolReconciler } from './reconcile.js'
import { HOLD_TOKEN_SEPARATOR, type SessionServiceDeps } from './session-deps.js'
import {
  type InterruptedTurn,
  type SessionRow,
  SessionStore,
  type StoredTurn,
  toSessionInfo,
} from './session-store.js'
import { TurnEvents } from './turn-events.js'
import { MOVE_OPERATION, TurnLocks, TurnStop } from './turn-locks.js'
import { type TurnHandle, TurnRunner } from './turn-runner.js'
import { type TurnReplay, TurnStreams } from './turn-stream.js'
import { type SeenAgent, WarmAgents } from './warm-agents.js'

export type { SessionServiceDeps } from './session-deps.js'
export type { TurnHandle } from './turn-runner.js'
export type { TurnReplay } from './turn-stream.js'

/**
 * How long an exclusive operation's hold on a session lasts in the database unless renewed (it is,
 * every third of this, while the operation runs): what a replica that died holding one costs.
 */
const HOLD_MS = 60_000

/**
 * Sessions and their turns: one turn at a time per session, a warm agent process between turns
 * for the keep-warm window, every status change recorded with its cause. The pieces live beside
 * it: the turn lock (`turn-locks.ts`), the warm agents (`warm-agents.ts`), the turn itself
 * (`turn-runner.ts`), the policy timeouts (`reaper.ts`) and the start-up check (`reconcile.ts`).
 */
export class SessionService {
  readonly store: SessionStore
  private readonly generations: WorkspaceGenerations
  private readonly locks = new TurnLocks()
  private readonly warm: WarmAgents
  private readonly runner: TurnRunner
  private readonly turnEvents: TurnEvents
  private readonly turnStreams: TurnStreams
  private readonly reaper: SessionReaper
  private readonly reconciler: PoolReconciler
  /** Deletions in progress: the workspace goes before the row says `deleted`. */
  private readonly deleting = new Map<string, Promise<void>>()

  constructor(private readonly deps: SessionServiceDeps) {
    this.store = new SessionStore(
      deps.db,
      deps.runtimeId,
      deps.routing && ((id) => deps.routing?.placedNode(id)),
    )
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
    // Another replica asked (a cancel through it) to cancel a turn this one relays.
    deps.relays?.onCancelAsked((sessionId, turnId) => {
      if (locks.get(sessionId)?.turnId === turnId) void locks.cancel(sessionId)
    })
  }

  private now(): string {
    return iso(this.deps.clock.now())
  }

  private async info(row: SessionRow): Promise<SessionInfo> {
    return toSessionInfo(row, await this.warm.has(row.id).catch((error: unknown) => this.unreachable(error)))
  }

  /**
   * A session's row is answered whatever its node's state: a node lost or out of reach (an API
   * replica's routing) only means its sandbox is not known to be warm.
   */
  private unreachable(error: unknown): false {
    const code = error instanceof CairnProblem ? error.code : undefined
    if (code === 'node_lost' || code === 'node_unavailable' || code === 'node_fenced') return false
    throw error
  }

  async require<R extends SessionRow = SessionRow>(
    tenantId: string,
    id: string,
    read: (tenantId: string, id: string) => Promise<R | undefined> = (t, i) =>
      this.store.get(t, i) as Promise<R | undefined>,
  ): Promise<R> {
    const row = await read.call(this.store, tenantId, id)
    if (!row) throw new CairnProblem('session_not_found', `No session found matching '${id}'`)
    return row
  }

  /**
   * The session, for an operation on its runtime (its sandbox, workspace or snapshots): refused
   * with `session_elsewhere` (retryable, naming the owner) when another replica's runtime holds it.
   */
  async requireOwned<R extends SessionRow = SessionRow>(
    tenantId: string,
    id: string,
    read?: (tenantId: string, id: string) => Promise<R | undefined>,
  ): Promise<R> {
    const row = await this.require<R>(tenantId, id, read)
    // An API replica routes every session to its node.
    if (this.deps.routing) return row
    if (row.runtime_id !== null && row.runtime_id !== this.deps.runtimeId)
      throw new CairnProblem(
        'session_elsewhere',
        `session ${id} lives on runtime ${row.runtime_id}, not on this server's (${this.deps.runtimeId}); send the request to the server of that runtime`,
        { runtimeId: row.runtime_id },
      )
    return row
  }

  /** The session on this runtime, refused with `session_deleted` once it was deleted (its row stays). */
  async requireLive(tenantId: string, id: string): Promise<SessionRow> {
    const row = await this.requireOwned(tenantId, id)
    if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${id} was deleted`)
    return row
  }

  /**
   * Runs a read of a session's live workspace. A restore or an import renames it aside for a moment
   * and a deletion removes it before the row says so: a read that meets either answers
   * `session_busy` or `session_deleted`, not a 404, a 403 (its file seen outside the path) or a 500.
   */
  async readingWorkspace<T>(
    tenantId: string,
    id: string,
    read: () => Promise<T>,
    /** A walk over many entries (a listing, a diff): one that overlapped a swap may mix both trees. */
    walk = false,
  ): Promise<T> {
    // Only a swap moves the workspace: a read failing during a manual snapshot keeps its own error.
    const epoch = this.locks.swapEpoch(id)
    const swappingAtStart = this.locks.swapping(id)
    // A swap through another replica, as the database shows it: held, or started since.
    const shared = await this.store.swaps(id, this.now())
    const overlappedSwap = async () => {
      if (shared.swapping || this.locks.swapping(id) || this.locks.swapEpoch(id) !== epoch) return true
      if (swappingAtStart) return true
      const now = await this.store.swaps(id, this.now())
      return now.swapping || now.started !== shared.started
    }
    let result: T
    try {
      result = await read()
    } catch (error) {
      // Any failure of a read that overlapped a swap is the swap's doing, whatever it looked like.
      const overlapped = await overlappedSwap()
      const code = (error as { code?: unknown }).code
      if (overlapped || code === 'ENOENT' || code === 'not_found' || code === 'forbidden') {
        if (overlapped || this.deleting.has(id) || !(await this.deps.runtime.hasWorkspace(id)))
          throw await this.missingWorkspace(tenantId, id, overlapped)
      }
      if (code === 'ENOENT') throw new CairnProblem('not_found', 'no such file in the workspace')
      throw error
    }
    if (walk && (await overlappedSwap())) throw await this.missingWorkspace(tenantId, id, true)
    return result
  }

  /** The exclusive operation (e.g. "a restore") holding the session, if any. */
  busyWith(id: string): string | undefined {
    return this.locks.busyWith(id)
  }

  /**
   * What a workspace missing from the pool means. Concurrent requests see it missing for a moment
   * while a deletion or a restore's swap runs: those are `session_deleted` and `session_busy`
   * (retry), not `state_lost`, which is kept for a workspace that is really gone.
   */
  async missingWorkspace(tenantId: string, id: string, swapped = false): Promise<CairnProblem> {
    if (this.deleting.has(id) || (await this.store.get(tenantId, id))?.status === 'deleted')
      return new CairnProblem('session_deleted', `session ${id} was deleted`)
    // Held here, or through another replica (its hold is in the database).
    const op = this.busyWith(id) ?? (await this.store.heldFor(id, this.now()))
    if (op) return new CairnProblem('session_busy', `session ${id} is busy with ${op}; retry when it is done`)
    // Missing a moment ago and there now: a swap (through any replica) ended meanwhile.
    if (swapped || (await this.deps.runtime.hasWorkspace(id)))
      return new CairnProblem(
        'session_busy',
        `the workspace of session ${id} was replaced (a restore or an import) while it was read; retry`,
      )
    return new CairnProblem('state_lost', `the workspace of session ${id} is missing from the storage pool`)
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

  async get(tenantId: string, id: string): Promise<SessionInfo> {
    return this.info(await this.require(tenantId, id))
  }

  async list(
    tenantId: string,
    query: {
      agent?: string | undefined
      status?: SessionStatus | undefined
      limit?: number | undefined
      cursor?: string | undefined
    },
  ): Promise<SessionList> {
    const limit = query.limit ?? 50
    const agentId = query.agent ? (await this.deps.agents.require(tenantId, query.agent)).id : undefined
    const rows = await this.store.list(tenantId, {
      agentId,
      status: query.status,
      limit: limit + 1,
      cursor: query.cursor ? decodeCursor(query.cursor) : undefined,
    })
    const page = rows.slice(0, limit)
    const last = page[page.length - 1]
    return {
      data: await Promise.all(page.map((row) => this.info(row))),
      nextCursor: rows.length > limit && last ? encodeCursor(last.created_at, last.id) : null,
    }
  }

  async resolve(tenantId: string, rawPrefix: string): Promise<SessionInfo> {
    const prefix = rawPrefix.startsWith('ses_') ? rawPrefix : `ses_${rawPrefix}`
    if (!/^ses_[0-9a-z]*$/.test(prefix)) {
      throw new CairnProblem('session_not_found', `No session found matching '${rawPrefix}'`)
    }
    const matches = await this.store.resolvePrefix(tenantId, prefix, 6)
    if (matches.length === 0)
      throw new CairnProblem('session_not_found', `No session found matching '${rawPrefix}'`)
    if (matches.length > 1) {
      throw new CairnProblem('ambiguous_id', `Ambiguous ID '${rawPrefix}' — matches: ${matches.join(', ')}`, {
        matches,
      })
    }
    return this.get(tenantId, matches[0] as string)
  }

  async messages(tenantId: string, id: string): Promise<Message[]> {
    await this.require(tenantId, id)
    return this.store.messages(id)
  }

  async events(tenantId: string, id: string): Promise<StatusEvent[]> {
    await this.require(tenantId, id)
    return this.store.events(id)
  }

  async network(tenantId: string, id: string, limit = 500): Promise<NetworkEventInfo[]> {
    await this.require(tenantId, id)
    return this.store.networkLog.recent(id, limit)
  }

  async turns(tenantId: string, id: string): Promise<TurnInfo[]> {
    await this.require(tenantId, id)
    return this.store.turns(id)
  }

  /** A turn of the tenant's by its ID alone (`not_found` for another tenant's, as for none). */
  async turn(tenantId: string, turnId: string): Promise<StoredTurn> {
    const turn = await this.store.turnById(turnId)
    // The store reads a session by tenant and ID: another tenant's is none.
    if (!turn || !(await this.store.get(tenantId, turn.sessionId)))
      throw new CairnProblem('not_found', `No turn '${turnId}'`)
    return turn
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

  /** Stops the session's warm sandbox, if any (runtime state is disposable). */
  stopSandbox(sessionId: string): Promise<void> {
    return this.warm.drop(sessionId)
  }

  /**
   * Runs `fn` holding the session's turn lock, so no message starts meanwhile; refuses with
   * `session_busy` while a turn runs.
   */
  async exclusive<T>(
    tenantId: string,
    id: string,
    what: string,
    fn: (row: SessionRow) => Promise<T>,
    swapsWorkspace = false,
  ): Promise<T> {
    const row = await this.requireLive(tenantId, id)
    if (this.locks.has(id)) {
      throw new CairnProblem(
        'session_busy',
        `session ${id} is running a turn; ${what} must wait for it or cancel it`,
      )
    }
    if (this.locks.changingFiles(id)) {
      throw new CairnProblem(
        'session_busy',
        `session ${id} has a file write in progress; retry ${what} after it`,
      )
    }
    // This process's lock first (taken at once after the checks above, nothing awaited between),
    // then the database's, which other replicas see.
    return this.locks.holdExclusive(
      id,
      what,
      () => this.heldInDatabase(id, { operation: what, swapsWorkspace }, () => fn(row)),
      swapsWorkspace,
    )
  }

  /**
   * Runs `fn` with the session held in the database too: replicas share it, and a turn begun
   * through another one (which cannot see this process's locks) is refused while `fn` runs. The
   * hold is renewed while it lasts; a replica that died with it holds it as long as its lease
   * (the leader releases it then, as it ends its turns), `HOLD_MS` at most.
   */
  private async heldInDatabase<T>(
    id: string,
    hold: { operation: string; swapsWorkspace: boolean },
    fn: () => Promise<T>,
  ): Promise<T> {
    const what = hold.operation
    // A replica's hold names its lease: the leader releases it once that lease is over.
    const relayId = this.deps.relays?.relayId
    const token = relayId ? `${relayId}${HOLD_TOKEN_SEPARATOR}${randomUUID()}` : randomUUID()
    const release = () =>
      releaseHold(
        () => this.store.releaseHold(id, token),
        { session: id, operation: what },
        { untilMs: Date.now() + HOLD_MS, logger: this.deps.logger },
      )
    let refused: Awaited<ReturnType<SessionStore['hold']>>
    try {
      refused = await this.store.hold(id, hold, token, this.now(), HOLD_MS)
    } catch (error) {
      // Unanswered, the hold may still have been taken: it is let go once the database answers.
      void release()
      throw error
    }
    if (refused && 'turnRunning' in refused)
      throw new CairnProblem(
        'session_busy',
        `session ${id} is running a turn; ${what} must wait for it or cancel it`,
      )
    if (refused)
      throw refused.heldFor === MOVE_OPERATION
        ? new CairnProblem(
            'session_moving',
            `session ${id} is being moved to another node; retry in a moment`,
          )
        : new CairnProblem(
            'session_busy',
            `session ${id} is busy with ${refused.heldFor}; retry when it is done`,
          )
    const renewal = setInterval(() => {
      this.store
        .renewHold(id, token, this.now(), HOLD_MS)
        .then((renewed) => {
          if (!renewed)
            this.deps.logger.error(
              { session: id, operation: what },
              'a session hold lapsed while its operation runs: other replicas may act on the session',
            )
        })
        .catch((error: unknown) =>
          this.deps.logger.warn({ err: error, session: id }, 'renewing a session hold failed'),
        )
    }, HOLD_MS / 3)
    renewal.unref()
    try {
      return await fn()
    } finally {
      clearInterval(renewal)
      await release()
    }
  }

  /**
   * Runs a change to the live workspace through the files API. A restore or an import swaps the
   * workspace: a write meeting one would land in the copy being replaced (lost) or find no
   * workspace at all, so it answers `session_busy` instead, and no such operation starts while
   * a write is in flight.
   */
  async changingWorkspace<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const before = await this.store.swaps(id, this.now())
    const op = this.busyWith(id) ?? before.heldFor
    if (op) throw new CairnProblem('session_busy', `session ${id} is busy with ${op}; retry when it is done`)
    // Through another replica a swap cannot see this write in flight: one that started meanwhile
    // may have left the write in the copy it replaced, so the write is not answered as done.
    const metSwap = async () => {
      const after = await this.store.swaps(id, this.now())
      return after.swapping || after.started !== before.started
    }
    const replaced = () =>
      new CairnProblem(
        'session_busy',
        `the workspace of session ${id} was replaced (a restore or an import) while it was written; write again`,
      )
    let result: T
    try {
      result = await this.locks.holdFileChange(id, fn)
    } catch (error) {
      // Any failure of a write that met a swap is the swap's doing (a path missing for a moment).
      if (await metSwap()) throw replaced()
      // One that met a delete found its workspace gone: the session's state, not a server fault.
      if (this.deleting.has(id) || (await this.store.statusOf(id)) === 'deleted')
        throw new CairnProblem('session_deleted', `session ${id} was deleted while its workspace was written`)
      throw error
    }
    if (await metSwap()) throw replaced()
    return result
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
  async verifyBeforeTurn(tenantId: string, id: string): Promise<SeenAgent | undefined> {
    // A warm or busy session has nothing to check here (and `beginTurn` reads the row, refusing
    // what this caller may not see): a warm turn reads the session once, not twice.
    if (this.locks.has(id)) return undefined
    const seen: SeenAgent = { agent: await this.warm.agent(id) }
    if (seen.agent) return seen
    const row = await this.requireOwned(tenantId, id)
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
    const inFlight = this.deleting.get(id)
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
    this.deleting.set(id, work)
    try {
      await work
    } finally {
      this.deleting.delete(id)
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
