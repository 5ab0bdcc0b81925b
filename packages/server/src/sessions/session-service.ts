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
  type StatusCause,
  type StatusEvent,
  type StreamEvent,
  type TranscriptLine,
  type TurnInfo,
} from '@cairn/protocol'
import {
  type AgentEvent,
  type AgentProcess,
  DEFAULT_LIMITS,
  DEFAULT_TURN_TIMEOUT_MS,
  type Runtime,
  type TurnOutcome,
} from '@cairn/runtime'
import type { Logger } from 'pino'
import type { AgentService } from '../agents/agent-service.js'
import { ENV_VARIABLES, envBinds } from '../agents/builder.js'
import { type Clock, iso } from '../clock.js'
import { whenNotBusy } from '../db/busy.js'
import type { Db } from '../db/database.js'
import type { MemoryService } from '../memory/memory-service.js'
import type { MetricsRegistry } from '../metrics/registry.js'
import { redact, type SecretStore } from '../secrets/secret-store.js'
import { manifestSetup, type SetupService } from '../setup/setup-service.js'
import { decodeCursor, encodeCursor } from './cursor.js'
import { WorkspaceGenerations } from './generations.js'
import { changedPolicy, createPolicy, deadlineFor, limitReached, policyOf } from './policy.js'
import { type InterruptedTurn, type SessionRow, SessionStore, toSessionInfo } from './session-store.js'

export interface SessionServiceDeps {
  db: Db
  runtime: Runtime
  agents: AgentService
  secrets: SecretStore
  /** Private addresses the operator lets sandboxes reach through the egress proxy. */
  egressPrivateExceptions?: ReadonlySet<string> | undefined
  /** Extra CA certificates (PEM) the egress proxy trusts upstream when it terminates TLS. */
  egressUpstreamCaPems?: readonly string[] | undefined
  metrics?: MetricsRegistry | undefined
  memory?: MemoryService | undefined
  /** The per-session setup phase (`setup` on creation, `session.setup` in cairn.yaml). */
  setup?: SetupService | undefined
  clock: Clock
  logger: Logger
}

interface WarmAgent {
  agent: AgentProcess
  timer: NodeJS.Timeout | undefined
  /** When the cooldown timer fires (epoch ms), so activity only ever extends it. */
  until?: number | undefined
}

interface RunningTurn {
  turnId: string
  abort: AbortController
  done: Promise<void>
}

const TITLE_MAX = 60
/** Below this much free space, an agent's ENOSPC is blamed on the pool. */
const POOL_FULL_BYTES = 16 * 1024 * 1024

/** A turn accepted by `beginTurn`: validation is over, the lock is held, `run` streams it. */
export interface TurnHandle {
  readonly turnId: string
  run(emit: (event: StreamEvent) => void): Promise<void>
}

/**
 * Sessions and their turns: one turn at a time per session, a warm agent process between turns
 * for the keep-warm window, every status change recorded with its cause.
 */
export class SessionService {
  readonly store: SessionStore
  private readonly generations: WorkspaceGenerations
  private readonly warm = new Map<string, WarmAgent>()
  private readonly running = new Map<string, RunningTurn>()
  /** Sessions an exclusive operation (a restore swapping the workspace…) holds, with what it is. */
  private readonly exclusiveOps = new Map<string, string>()
  /** Deletions in progress: the workspace goes before the row says `deleted`. */
  private readonly deleting = new Map<string, Promise<void>>()
  private reaper: NodeJS.Timeout | undefined
  private readonly transcripts = new Map<string, { seq: number; lines: TranscriptLine[] }>()
  private createdHook: ((row: SessionRow) => void) | undefined
  private deletedHook: ((sessionId: string) => Promise<void>) | undefined
  private afterTurnHook: ((row: SessionRow, seq: number, agent: AgentProcess | undefined) => void) | undefined
  private beforeTurnHook: ((row: SessionRow, seq: number, agent: AgentProcess) => Promise<void>) | undefined
  private unchangedProbe: ((sessionId: string, agent: AgentProcess) => Promise<boolean>) | undefined

  constructor(private readonly deps: SessionServiceDeps) {
    this.store = new SessionStore(deps.db)
    this.generations = new WorkspaceGenerations(this.store, deps.runtime.pool, () => this.now())
  }

  private now(): string {
    return iso(this.deps.clock.now())
  }

  private info(row: SessionRow): SessionInfo {
    return toSessionInfo(row, this.warm.has(row.id))
  }

  require(tenantId: string, id: string): SessionRow {
    const row = this.store.get(tenantId, id)
    if (!row) throw new CairnProblem('session_not_found', `No session found matching '${id}'`)
    return row
  }

  /**
   * Runs a read of a session's live workspace. A restore renames it aside for a moment and a
   * deletion removes it before the row says so: a read that meets either answers `session_busy`
   * or `session_deleted`, not a 404, a 403 (its file seen outside the path) or a 500.
   */
  async readingWorkspace<T>(tenantId: string, id: string, read: () => Promise<T>): Promise<T> {
    try {
      return await read()
    } catch (error) {
      const code = (error as { code?: unknown }).code
      if (code === 'ENOENT' || code === 'not_found' || code === 'forbidden') {
        if (this.busyWith(id) || this.deleting.has(id) || !(await this.deps.runtime.pool.hasWorkspace(id)))
          throw this.missingWorkspace(tenantId, id)
      }
      if (code === 'ENOENT') throw new CairnProblem('not_found', 'no such file in the workspace')
      throw error
    }
  }

  /** The exclusive operation (e.g. "a restore") holding the session, if any. */
  busyWith(id: string): string | undefined {
    return this.exclusiveOps.get(id)
  }

  /**
   * What a workspace missing from the pool means. Concurrent requests see it missing for a moment
   * while a deletion or a restore's swap runs: those are `session_deleted` and `session_busy`
   * (retry), not `state_lost`, which is kept for a workspace that is really gone.
   */
  missingWorkspace(tenantId: string, id: string): CairnProblem {
    if (this.deleting.has(id) || this.store.get(tenantId, id)?.status === 'deleted')
      return new CairnProblem('session_deleted', `session ${id} was deleted`)
    const op = this.busyWith(id)
    if (op) return new CairnProblem('session_busy', `session ${id} is busy with ${op}; retry when it is done`)
    return new CairnProblem('state_lost', `the workspace of session ${id} is missing from the storage pool`)
  }

  async create(tenantId: string, body: CreateSessionBody): Promise<SessionInfo> {
    const agent = this.deps.agents.require(tenantId, body.agent)
    if (!agent.current_revision_id) {
      throw new CairnProblem('agent_not_ready', `agent '${agent.name}' has no READY revision yet`)
    }
    const missing = this.deps.secrets.missing(agent.id, this.deps.agents.requiredSecrets(agent.id))
    if (missing.length > 0) {
      throw new CairnProblem(
        'secrets_missing',
        `agent '${agent.name}' needs secrets that are not set: ${missing.join(', ')} (cairn secrets set ${agent.name} ${missing[0]}=…)`,
        { missing },
      )
    }
    const revision = this.deps.agents.store.revision(agent.current_revision_id)
    const setup = body.setup ?? (revision ? manifestSetup(revision.manifest) : undefined)
    if (setup && !this.deps.setup) throw new CairnProblem('bad_request', 'this server has no setup phase')
    const policy = createPolicy(body)
    const id = newId('session')
    await this.deps.runtime.pool.createWorkspace(id, agent.current_revision_id)
    this.store.insert({
      id,
      tenant_id: tenantId,
      agent_id: agent.id,
      revision_id: agent.current_revision_id,
      title: body.title ?? null,
      status: 'idle',
      status_cause: 'created',
      idle_timeout_ms: policy.idleTimeoutMs,
      keep_warm_ms: policy.keepWarmMs,
      max_turns: policy.maxTurns,
      max_duration_ms: policy.maxDurationMs,
      deadline_at: deadlineFor(policy, this.deps.clock.now()),
      on_timeout: policy.onTimeout,
      auto_snapshots: body.autoSnapshots === false ? 0 : 1,
      network_json: body.network ? JSON.stringify(body.network) : null,
      ephemeral: body.ephemeral ? 1 : 0,
      keep_transcript: body.ephemeral && !body.keepTranscript ? 0 : 1,
      created_at: this.now(),
    })
    if (setup) this.deps.setup?.record(id, setup)
    const created = this.require(tenantId, id)
    this.createdHook?.(created)
    return this.info(created)
  }

  get(tenantId: string, id: string): SessionInfo {
    return this.info(this.require(tenantId, id))
  }

  list(
    tenantId: string,
    query: {
      agent?: string | undefined
      status?: SessionStatus | undefined
      limit?: number | undefined
      cursor?: string | undefined
    },
  ): SessionList {
    const limit = query.limit ?? 50
    const agentId = query.agent ? this.deps.agents.require(tenantId, query.agent).id : undefined
    const rows = this.store.list(tenantId, {
      agentId,
      status: query.status,
      limit: limit + 1,
      cursor: query.cursor ? decodeCursor(query.cursor) : undefined,
    })
    const page = rows.slice(0, limit)
    const last = page[page.length - 1]
    return {
      data: page.map((row) => this.info(row)),
      nextCursor: rows.length > limit && last ? encodeCursor(last.created_at, last.id) : null,
    }
  }

  resolve(tenantId: string, rawPrefix: string): SessionInfo {
    const prefix = rawPrefix.startsWith('ses_') ? rawPrefix : `ses_${rawPrefix}`
    if (!/^ses_[0-9a-z]*$/.test(prefix)) {
      throw new CairnProblem('session_not_found', `No session found matching '${rawPrefix}'`)
    }
    const matches = this.store.resolvePrefix(tenantId, prefix, 6)
    if (matches.length === 0)
      throw new CairnProblem('session_not_found', `No session found matching '${rawPrefix}'`)
    if (matches.length > 1) {
      throw new CairnProblem('ambiguous_id', `Ambiguous ID '${rawPrefix}' — matches: ${matches.join(', ')}`, {
        matches,
      })
    }
    return this.get(tenantId, matches[0] as string)
  }

  messages(tenantId: string, id: string): Message[] {
    this.require(tenantId, id)
    return this.store.messages(id)
  }

  events(tenantId: string, id: string): StatusEvent[] {
    this.require(tenantId, id)
    return this.store.events(id)
  }

  network(tenantId: string, id: string, limit = 500): NetworkEventInfo[] {
    this.require(tenantId, id)
    return this.store.network(id, limit)
  }

  turns(tenantId: string, id: string): TurnInfo[] {
    this.require(tenantId, id)
    return this.store.turns(id)
  }

  /**
   * Validates and locks synchronously, so a second message for the same session is refused with
   * `session_busy` before anything is streamed.
   */
  beginTurn(tenantId: string, id: string, prompt: string): TurnHandle {
    let row = this.require(tenantId, id)
    if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${id} was deleted`)
    if (this.running.has(id)) {
      throw new CairnProblem(
        'session_busy',
        `session ${id} is already running a turn; wait for it or cancel it`,
        {
          turnId: this.running.get(id)?.turnId,
        },
      )
    }
    if (!prompt.trim()) throw new CairnProblem('validation_failed', 'prompt must not be empty')
    this.checkLimits(row)
    const turnId = newId('turn')
    const abort = new AbortController()
    let release!: () => void
    const done = new Promise<void>((resolve) => {
      release = resolve
    })
    this.running.set(id, { turnId, abort, done })
    const at = this.now()
    const seq = row.turn_count + 1
    try {
      // One transaction: a database locked by another writer refuses the whole message (503
      // unavailable), never half of it.
      this.deps.db.transaction(() => {
        if (row.status !== 'idle') {
          // Messaging a completed, failed or timed-out session resumes it on its workspace (one
          // that a policy limit stopped was refused above: only an explicit resume brings it back).
          this.store.transition(row, 'idle', 'user_resume', at, 'message sent')
        }
        this.store.startTurn(
          id,
          turnId,
          seq,
          prompt,
          prompt.replace(/\s+/g, ' ').trim().slice(0, TITLE_MAX),
          at,
        )
        this.store.transition({ id, status: 'idle' }, 'active', 'turn_started', at, turnId)
      })()
    } catch (error) {
      this.running.delete(id)
      release()
      throw error
    }
    row = { ...row, status: 'idle' }
    return {
      turnId,
      run: async (emit) => {
        try {
          await this.runTurn({ ...row, status: 'active' }, turnId, seq, prompt, abort.signal, emit)
        } finally {
          this.running.delete(id)
          release()
        }
      },
    }
  }

  private async runTurn(
    row: SessionRow,
    turnId: string,
    seq: number,
    prompt: string,
    signal: AbortSignal,
    emit: (event: StreamEvent) => void,
  ): Promise<void> {
    const startedAt = this.deps.clock.now()
    const elapsed = () => Math.max(0, Math.round(performance.now() - startedPerf))
    const startedPerf = performance.now()
    let outcome: TurnOutcome
    let sandboxId = ''
    let promptSent = false
    try {
      // The setup phase runs before the agent's sandbox exists: the agent never shares a process
      // tree, an environment or a /proc with the setup secrets.
      if (this.deps.setup?.needed(row.id)) {
        await this.dropWarm(row.id)
        await this.deps.setup.run(row, (event) => this.store.recordNetwork(row.id, event), signal)
      }
      const { agent, cold } = await this.agentFor(row)
      sandboxId = agent.sandboxId
      await whenNotBusy(() => this.store.setTurnSandbox(turnId, sandboxId, cold))
      if (this.beforeTurnHook) await this.beforeTurnHook(row, seq, agent)
      emit({ type: 'run.started', sessionId: row.id, turnId, turn: seq, sandboxId, coldStart: cold })
      const transcript = this.transcriptBefore(row.id, seq)
      const secretValues = this.deps.secrets.values(row.agent_id, ['runtime', 'setup', 'proxy'])
      const clean = (event: StreamEvent): StreamEvent =>
        event.type === 'message.delta' ? { ...event, content: redact(event.content, secretValues) } : event
      promptSent = true
      outcome = await agent.runTurn(
        { prompt, turn: seq, turnId, transcript },
        (event) => emit(clean(toStreamEvent(turnId, event))),
        signal,
      )
      outcome = {
        ...outcome,
        text: redact(outcome.text, secretValues),
        stderr: redact(outcome.stderr, secretValues),
      }
      if (outcome.status === 'failed') {
        outcome = { ...outcome, message: redact(outcome.message, secretValues) }
        outcome = await this.blamePoolIfFull(outcome)
      }
      if (!agent.alive) await this.dropWarm(row.id)
      else this.scheduleCooldown(row)
    } catch (error) {
      const problem = error instanceof CairnProblem ? error : undefined
      if (problem?.code === 'setup_failed') this.deps.logger.warn({ session: row.id }, problem.message)
      else this.deps.logger.error({ err: error, session: row.id }, 'turn could not start')
      const setupFailed = problem?.code === 'setup_failed'
      outcome = signal.aborted
        ? { status: 'cancelled', text: '', stderr: '' }
        : {
            status: 'failed',
            code: problem?.code ?? 'sandbox_failed',
            cause: setupFailed
              ? 'setup_failed'
              : problem?.code === 'state_lost' || problem?.code === 'storage_error'
                ? problem.code
                : 'agent_crash',
            message: problem?.message ?? `the sandbox could not start: ${(error as Error).message}`,
            text: '',
            stderr: setupFailed ? String(problem.details?.logTail ?? '') : '',
          }
      if (!sandboxId)
        emit({ type: 'run.started', sessionId: row.id, turnId, turn: seq, sandboxId: '', coldStart: true })
      await this.dropWarm(row.id)
    }
    const durationMs = elapsed()
    const endedAt = iso(Math.max(this.deps.clock.now(), startedAt))
    this.rememberTurn(row.id, seq, prompt, outcome.text)
    this.deps.metrics?.turns.inc({ outcome: outcome.status })
    this.deps.metrics?.turnSeconds.observe(durationMs / 1000)
    const failed = outcome.status === 'failed' ? outcome : undefined
    const endedAs: SessionStatus = failed ? 'failed' : 'idle'
    const cause: StatusCause = failed
      ? failed.cause
      : outcome.status === 'cancelled'
        ? 'turn_cancelled'
        : outcome.status === 'completed' && outcome.agentExited
          ? 'agent_exit'
          : 'turn_completed'
    // Whatever the agent did to the workspace is a new generation (a turn that provably changed
    // nothing keeps it, so its unchanged subvolume needs no snapshot): the marker in the pool first
    // (a crash after it leaves the disk ahead, never behind), so the snapshot that follows the
    // turn carries it.
    let generation: number | undefined
    const warmAgent = this.warm.get(row.id)?.agent
    const unchanged =
      promptSent && warmAgent?.alive && this.unchangedProbe
        ? await this.unchangedProbe(row.id, warmAgent).catch(() => false)
        : false
    if (promptSent && !unchanged) {
      generation = await this.generations.markNext(row.id).catch((error) => {
        this.deps.logger.warn({ err: error, session: row.id }, 'workspace generation not advanced')
        return undefined
      })
    }
    // The policy's last turn ends the session; its sandbox goes before the reply's end is sent.
    const maxTurns = row.max_turns
    const lastTurn = maxTurns !== null && seq >= maxTurns
    if (lastTurn) await this.dropWarm(row.id)
    // The turn's entry, the session's status and generation in one transaction, retried while
    // another process holds the database lock: the reply was streamed already, it must not be lost.
    // Nothing is awaited between the terminal event and the release of the turn lock, so a client
    // that sends its next message on `run.completed` never meets `session_busy`.
    await whenNotBusy(() =>
      this.deps.db.transaction(() => {
        this.store.finishTurn(row.id, {
          id: turnId,
          status: outcome.status,
          response: outcome.text,
          stderr: outcome.stderr.slice(-16_384),
          errorCode: failed?.code ?? null,
          errorMessage: failed?.message ?? null,
          endedAt,
          durationMs,
        })
        this.store.transition(row, endedAs, cause, endedAt, failed ? `${turnId}: ${failed.message}` : turnId)
        if (generation !== undefined) this.store.setGeneration(row.id, generation)
        if (lastTurn) {
          this.store.transition(
            { id: row.id, status: endedAs },
            'completed',
            'max_turns',
            endedAt,
            `${seq} of ${maxTurns} turns`,
          )
        }
      })(),
    )
    if (outcome.status === 'completed') {
      emit({ type: 'run.completed', turnId, text: outcome.text, durationMs })
    } else if (outcome.status === 'cancelled') {
      emit({ type: 'run.cancelled', turnId, durationMs })
    } else if (failed) {
      emit({
        type: 'run.failed',
        turnId,
        durationMs,
        error: {
          code: failed.code,
          message: failed.message,
          details: { stderrTail: failed.stderr.slice(-2000) },
        },
      })
    }
    this.afterTurnHook?.(row, seq, this.warm.get(row.id)?.agent)
    const memory = this.deps.memory
    if (memory) {
      void memory
        .promoteProposed(row.agent_id, this.deps.runtime.pool.workspacePath(row.id), `${row.id}/${turnId}`)
        .catch((error) => this.deps.logger.warn({ err: error, session: row.id }, 'memory promotion failed'))
    }
  }

  /**
   * An agent that fell over on `ENOSPC` while the pool is (nearly) full did not crash on its own:
   * the turn is reported as `storage_error` with the pool's figures, so the fix (free space) is clear.
   */
  private async blamePoolIfFull(outcome: Extract<TurnOutcome, { status: 'failed' }>): Promise<TurnOutcome> {
    if (!/No space left on device|ENOSPC/.test(`${outcome.message}\n${outcome.stderr}`)) return outcome
    const stats = await this.deps.runtime.pool.poolStats().catch(() => undefined)
    if (!stats || stats.freeBytes > POOL_FULL_BYTES) return outcome
    return {
      ...outcome,
      code: 'storage_error',
      cause: 'storage_error',
      message: `the storage pool is full (${stats.freeBytes} of ${stats.totalBytes} bytes free): the agent's writes failed with "No space left on device"; free space in the pool, then resume the session. Agent: ${outcome.message}`,
    }
  }

  /**
   * The conversation before turn `seq`, for the agent. Read from the database once per warm
   * sandbox, then extended turn by turn in memory (reading every turn back was O(turns) per turn).
   */
  private transcriptBefore(sessionId: string, seq: number): TranscriptLine[] {
    const cached = this.transcripts.get(sessionId)
    if (cached && cached.seq === seq - 1) return cached.lines
    const lines: TranscriptLine[] = []
    for (const turn of this.store.turns(sessionId)) {
      if (turn.seq >= seq) break
      lines.push({ v: 1, role: 'user', turn: turn.seq, content: turn.prompt })
      if (turn.response) lines.push({ v: 1, role: 'assistant', turn: turn.seq, content: turn.response })
    }
    this.transcripts.set(sessionId, { seq: seq - 1, lines })
    return lines
  }

  private rememberTurn(sessionId: string, seq: number, prompt: string, response: string): void {
    const cached = this.transcripts.get(sessionId)
    if (!cached || cached.seq !== seq - 1) {
      this.transcripts.delete(sessionId)
      return
    }
    cached.lines.push({ v: 1, role: 'user', turn: seq, content: prompt })
    if (response) cached.lines.push({ v: 1, role: 'assistant', turn: seq, content: response })
    cached.seq = seq
  }

  private async agentFor(row: SessionRow): Promise<{ agent: AgentProcess; cold: boolean }> {
    const warm = this.warm.get(row.id)
    if (warm?.agent.alive) {
      if (warm.timer) clearTimeout(warm.timer)
      warm.timer = undefined
      warm.until = undefined
      return { agent: warm.agent, cold: false }
    }
    if (warm) await this.dropWarm(row.id)
    const { pool } = this.deps.runtime
    if (!(await pool.hasWorkspace(row.id))) throw this.missingWorkspace(row.tenant_id, row.id)
    const revision = this.deps.agents.store.revision(row.revision_id)
    if (!revision) throw new CairnProblem('revision_not_found', `revision ${row.revision_id} is gone`)
    const limits = revision.manifest.limits ?? {}
    const envKey = revision.manifest.envKey ?? undefined
    const proxySecrets = this.deps.secrets.proxySecrets(row.tenant_id, row.agent_id)
    const agent = await this.deps.runtime.startAgent({
      sessionId: row.id,
      workspaceDir: pool.workspacePath(row.id),
      command: revision.command,
      protocol: revision.manifest.protocol ?? 'stdio',
      env: {
        ...(envKey ? ENV_VARIABLES : {}),
        ...this.deps.secrets.valuesForScope(row.tenant_id, row.agent_id, 'runtime'),
        // A proxy secret's variable holds only its stand-in; the egress proxy swaps in the value.
        ...Object.fromEntries(proxySecrets.map((secret) => [secret.name, secret.standIn])),
      },
      binds: [
        ...(envKey ? envBinds(this.deps.agents.envs.envPath(envKey), envKey) : []),
        ...(this.deps.memory ? [await this.deps.memory.bind(row.agent_id)] : []),
      ],
      egress: {
        policy: (row.network_json ? JSON.parse(row.network_json) : revision.manifest.network) ?? {
          allow: [],
        },
        privateExceptions: this.deps.egressPrivateExceptions,
        onEvent: (event) => this.store.recordNetwork(row.id, event),
        secrets: proxySecrets,
        upstreamCaPems: this.deps.egressUpstreamCaPems,
      },
      limits: {
        memoryMiB: limits.memoryMiB ?? DEFAULT_LIMITS.memoryMiB,
        pids: limits.pids ?? DEFAULT_LIMITS.pids,
        cpus: limits.cpus ?? DEFAULT_LIMITS.cpus,
      },
      turnTimeoutMs: limits.turnTimeoutMs ?? DEFAULT_TURN_TIMEOUT_MS,
      isolation: revision.manifest.isolation,
    })
    this.warm.set(row.id, { agent, timer: undefined })
    this.deps.metrics?.coldStarts.inc()
    return { agent, cold: true }
  }

  private scheduleCooldown(row: SessionRow): void {
    const warm = this.warm.get(row.id)
    if (!warm) return
    if (row.keep_warm_ms <= 0) {
      void this.dropWarm(row.id)
      return
    }
    warm.until = Date.now() + row.keep_warm_ms
    warm.timer = setTimeout(() => {
      if (this.running.has(row.id)) return
      void this.dropWarm(row.id)
    }, row.keep_warm_ms)
    warm.timer.unref()
  }

  /** Moves a cooling warm sandbox's stop to at least `ms` from now (never earlier). */
  private extendWarm(id: string, ms: number): void {
    const warm = this.warm.get(id)
    if (!warm?.timer) return
    const until = Date.now() + ms
    if (warm.until !== undefined && warm.until >= until) return
    clearTimeout(warm.timer)
    warm.until = until
    warm.timer = setTimeout(() => {
      if (this.running.has(id)) return
      void this.dropWarm(id)
    }, ms)
    warm.timer.unref()
  }

  private readonly activityWrittenAt = new Map<string, number>()

  /**
   * Activity that is not a turn (a preview request): the idle clock restarts and a warm sandbox
   * stays warm for its keep-warm window. The database write is throttled to once a second.
   */
  noteActivity(row: SessionRow): void {
    const now = this.deps.clock.now()
    if (now - (this.activityWrittenAt.get(row.id) ?? 0) >= 1000) {
      this.activityWrittenAt.set(row.id, now)
      this.store.touch(row.id, iso(now))
    }
    this.extendWarm(row.id, row.keep_warm_ms)
  }

  private async dropWarm(sessionId: string): Promise<void> {
    this.transcripts.delete(sessionId)
    this.activityWrittenAt.delete(sessionId)
    const warm = this.warm.get(sessionId)
    if (!warm) return
    this.warm.delete(sessionId)
    if (warm.timer) clearTimeout(warm.timer)
    await this.deps.runtime.stopAgent(warm.agent)
  }

  /** Called after the sandbox is ready and before the prompt is sent (pre-turn snapshots). */
  /** Called when a session is created (not awaited: the turn-0 snapshot is taken in the background). */
  onCreated(hook: (row: SessionRow) => void): void {
    this.createdHook = hook
  }

  onDeleted(hook: (sessionId: string) => Promise<void>): void {
    this.deletedHook = hook
  }

  /** Called once a turn has ended and its outcome was sent (not awaited: off the critical path). */
  onAfterTurn(hook: (row: SessionRow, seq: number, agent: AgentProcess | undefined) => void): void {
    this.afterTurnHook = hook
  }

  onBeforeTurn(hook: (row: SessionRow, seq: number, agent: AgentProcess) => Promise<void>): void {
    this.beforeTurnHook = hook
  }

  /**
   * Tells whether a warm agent's turn left the workspace exactly as its last automatic snapshot
   * (see `WorkspaceService.unchangedSince`): such a turn moves neither the generation nor, then,
   * the subvolume's change mark, so no snapshot follows it either.
   */
  onUnchangedProbe(probe: (sessionId: string, agent: AgentProcess) => Promise<boolean>): void {
    this.unchangedProbe = probe
  }

  workspaceDir(sessionId: string): string {
    return this.deps.runtime.pool.workspacePath(sessionId)
  }

  warmAgent(sessionId: string): AgentProcess | undefined {
    return this.warm.get(sessionId)?.agent
  }

  /** Stops the session's warm sandbox, if any (runtime state is disposable). */
  stopSandbox(sessionId: string): Promise<void> {
    return this.dropWarm(sessionId)
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
  ): Promise<T> {
    const row = this.require(tenantId, id)
    if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${id} was deleted`)
    if (this.running.has(id)) {
      throw new CairnProblem(
        'session_busy',
        `session ${id} is running a turn; ${what} must wait for it or cancel it`,
      )
    }
    let release!: () => void
    const done = new Promise<void>((resolve) => {
      release = resolve
    })
    this.running.set(id, { turnId: what, abort: new AbortController(), done })
    this.exclusiveOps.set(id, what)
    try {
      return await fn(row)
    } finally {
      this.exclusiveOps.delete(id)
      this.running.delete(id)
      release()
    }
  }

  get warmCount(): number {
    return this.warm.size
  }

  get runningCount(): number {
    return this.running.size
  }

  isWarm(sessionId: string): boolean {
    return this.warm.has(sessionId)
  }

  /** Cancels the running turn, if any, and waits for it to settle. */
  async cancel(tenantId: string, id: string): Promise<boolean> {
    this.require(tenantId, id)
    const running = this.running.get(id)
    if (!running) return false
    running.abort.abort()
    await running.done
    return true
  }

  async end(tenantId: string, id: string): Promise<SessionInfo> {
    const row = this.require(tenantId, id)
    if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${id} was deleted`)
    await this.cancel(tenantId, id)
    await this.dropWarm(id)
    const current = this.require(tenantId, id)
    if (current.ephemeral) {
      // Nothing of an ephemeral session stays on disk; its transcript only when asked for.
      await this.delete(tenantId, id, 'ephemeral_end')
      if (!current.keep_transcript) this.store.deleteTranscript(id)
      return this.get(tenantId, id)
    }
    if (current.status !== 'completed') this.store.transition(current, 'completed', 'user_end', this.now())
    return this.get(tenantId, id)
  }

  /**
   * Brings an ended, failed or timed-out session back (its workspace checked against the recorded
   * generation first), with `policy` changes applied; the `maxDurationMs` clock restarts.
   */
  async resume(tenantId: string, id: string, policy?: SessionPolicyInput): Promise<SessionInfo> {
    const row = this.require(tenantId, id)
    if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${id} was deleted`)
    if (!(await this.deps.runtime.pool.hasWorkspace(id))) throw this.missingWorkspace(tenantId, id)
    await this.verifyWorkspace(row)
    this.updatePolicy(row, policy, true)
    if (row.status !== 'idle' && row.status !== 'active')
      this.store.transition(row, 'idle', 'user_resume', this.now())
    this.store.touch(id, this.now())
    return this.get(tenantId, id)
  }

  /**
   * Applies policy changes (resume, restore). Refuses, changing nothing, a policy whose `maxTurns`
   * the session has already used up. `restartClock`: the `maxDurationMs` clock starts again now
   * (otherwise only when `maxDurationMs` itself changes).
   */
  updatePolicy(row: SessionRow, input: SessionPolicyInput | undefined, restartClock: boolean): void {
    const before = policyOf(row)
    const policy = this.validatePolicy(row, input)
    const nowMs = this.deps.clock.now()
    const deadline =
      restartClock || input?.maxDurationMs !== undefined ? deadlineFor(policy, nowMs) : row.deadline_at
    this.store.setPolicy(row.id, policy, deadline, iso(nowMs))
    const changed = (Object.keys(policy) as (keyof typeof policy)[]).filter((k) => policy[k] !== before[k])
    if (changed.length > 0) {
      this.store.transition(
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

  /** Refuses a message that the session's policy no longer allows. */
  private checkLimits(row: SessionRow): void {
    const nowMs = this.deps.clock.now()
    const hit = limitReached(row, nowMs)
    if (!hit) return
    if (hit.timeoutNow)
      this.store.transition(
        row,
        'timeout',
        'max_duration',
        iso(nowMs),
        `maxDurationMs ${row.max_duration_ms}`,
      )
    throw hit.problem
  }

  /**
   * Checks, before a sandbox uses it, that the workspace on disk is not older than the last
   * generation recorded: a subvolume rolled back or replaced behind Cairn's back is refused with
   * `state_lost` (and the session marked failed, with the reason in its events) instead of being
   * used quietly. A warm sandbox already holds its workspace, so it is not checked again.
   */
  async verifyWorkspace(row: SessionRow): Promise<void> {
    if (this.warm.has(row.id)) return
    await this.generations.verify(row, () => this.running.has(row.id))
  }

  /** Before a message: the workspace check of a session whose sandbox is not warm. */
  async verifyBeforeTurn(tenantId: string, id: string): Promise<void> {
    const row = this.require(tenantId, id)
    if (row.status === 'deleted' || this.running.has(id)) return
    await this.verifyWorkspace(row)
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
    const row = this.require(tenantId, id)
    if (row.status === 'deleted') return
    // A second delete of the same session waits for the first instead of racing it in the pool.
    const inFlight = this.deleting.get(id)
    if (inFlight) return inFlight
    const work = (async () => {
      await this.cancel(tenantId, id)
      await this.dropWarm(id)
      await this.deps.runtime.pool.deleteWorkspace(id)
      if (this.deletedHook) await this.deletedHook(id)
      this.store.transition(this.require(tenantId, id), 'deleted', cause, this.now(), detail)
    })()
    this.deleting.set(id, work)
    try {
      await work
    } finally {
      this.deleting.delete(id)
    }
  }

  /** Marks what a crashed predecessor left running; called once at start. */
  recover(): { sessions: number; turns: InterruptedTurn[] } {
    return this.store.recoverAfterRestart(this.now())
  }

  startReaper(intervalMs: number, more?: () => Promise<unknown>): void {
    let busy = false
    this.reaper = setInterval(() => {
      if (busy) return
      busy = true
      void (async () => {
        await this.reapIdle()
        await this.reapDeadlines()
        await more?.()
      })()
        .catch((error) => this.deps.logger.error({ err: error }, 'reaper failed'))
        .finally(() => {
          busy = false
        })
    }, intervalMs)
    this.reaper.unref()
  }

  async reapIdle(): Promise<number> {
    const expired = this.store.expiredIdle(this.deps.clock.now())
    for (const { id, tenant_id } of expired) {
      if (this.running.has(id)) continue
      await this.dropWarm(id)
      const row = this.store.get(tenant_id, id)
      if (row?.status !== 'idle') continue
      this.store.transition(row, 'timeout', 'idle_timeout', this.now(), `idle for ${row.idle_timeout_ms} ms`)
      await this.destroyOnTimeout(row, 'idle_timeout')
    }
    return expired.length
  }

  /** Sessions past their `maxDurationMs`: a running turn is cancelled, the session times out. */
  async reapDeadlines(): Promise<number> {
    const expired = this.store.pastDeadline(this.now())
    for (const { id, tenant_id } of expired) {
      const running = this.running.get(id)
      if (running) {
        running.abort.abort()
        await running.done
      }
      await this.dropWarm(id)
      const row = this.store.get(tenant_id, id)
      if (row?.status !== 'idle') continue
      this.store.transition(
        row,
        'timeout',
        'max_duration',
        this.now(),
        `maxDurationMs ${row.max_duration_ms} ran out at ${row.deadline_at}`,
      )
      await this.destroyOnTimeout(row, 'max_duration')
    }
    return expired.length
  }

  /** `onTimeout: destroy`: the workspace and snapshots go at the timeout, the cause recorded. */
  private async destroyOnTimeout(row: SessionRow, cause: 'idle_timeout' | 'max_duration'): Promise<void> {
    if (row.on_timeout !== 'destroy') return
    await this.delete(row.tenant_id, row.id, cause, 'policy onTimeout: destroy')
  }

  /**
   * An explicit lease ("the orchestrator is thinking"): the session counts as active until it
   * expires, the idle timeout does not fire, and a warm sandbox stays warm at least that long.
   */
  lease(tenantId: string, id: string, ttlMs: number): { sessionId: string; leaseUntil: string } {
    const row = this.require(tenantId, id)
    if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${id} was deleted`)
    const now = this.deps.clock.now()
    const until = iso(now + ttlMs)
    this.store.setLease(id, until, iso(now))
    this.extendWarm(id, Math.max(ttlMs, row.keep_warm_ms))
    return { sessionId: id, leaseUntil: until }
  }

  /** Lets running turns finish for up to `graceMs`, then cancels what is left. */
  async drain(graceMs: number): Promise<void> {
    const pending = [...this.running.values()].map((r) => r.done)
    if (pending.length === 0) return
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, graceMs)
    })
    await Promise.race([Promise.all(pending), timeout])
    if (timer) clearTimeout(timer)
    for (const running of this.running.values()) running.abort.abort()
    await Promise.all([...this.running.values()].map((r) => r.done))
  }

  /**
   * Checks the pool against the database at start: finishes interrupted restores, marks sessions
   * whose workspace is gone (loudly, `state_lost`), and removes subvolumes nothing refers to.
   */
  async reconcile(liveSnapshotIds: Set<string>): Promise<{ lost: string[]; orphans: string[] }> {
    const { pool } = this.deps.runtime
    const live = this.store.liveSessions()
    const liveIds = new Set(live.map((s) => s.id))
    // One directory read instead of several stats per session (start-up with 10,000 sessions).
    let present = new Set(await pool.listArea('sessions'))
    const interrupted = [...present].filter(
      (name) => name.endsWith('.restoring') || name.endsWith('.replaced'),
    )
    for (const name of new Set(interrupted.map((n) => n.replace(/\.(restoring|replaced)$/, '')))) {
      await pool.recoverWorkspace(name)
    }
    if (interrupted.length > 0) present = new Set(await pool.listArea('sessions'))
    const lost: string[] = []
    for (const session of live) {
      if (!present.has(session.id)) {
        lost.push(session.id)
        if (session.status !== 'failed') {
          this.store.transition(
            session,
            'failed',
            'state_lost',
            this.now(),
            'the workspace is missing from the storage pool',
          )
        }
      }
    }
    // Every remaining workspace against its last recorded generation (one read for all of them).
    lost.push(...(await this.generations.verifyAll(live.filter((s) => present.has(s.id)))))
    const orphans: string[] = []
    for (const name of present) {
      if (/^ses_[0-9a-z]+$/.test(name) && !liveIds.has(name)) {
        orphans.push(name)
        await pool.deleteWorkspace(name)
      }
    }
    for (const name of await pool.listArea('snapshots')) {
      if (/^snap_[0-9a-z]+$/.test(name) && !liveSnapshotIds.has(name)) {
        orphans.push(name)
        await pool.deleteSnapshot(name)
      }
    }
    for (const name of await pool.listArea('staging')) {
      orphans.push(name)
      await pool.discardStagingByName(name)
    }
    return { lost, orphans }
  }

  async close(): Promise<void> {
    if (this.reaper) clearInterval(this.reaper)
    for (const running of this.running.values()) running.abort.abort()
    await Promise.all([...this.running.values()].map((r) => r.done))
    await Promise.all([...this.warm.keys()].map((id) => this.dropWarm(id)))
  }
}

function toStreamEvent(turnId: string, event: AgentEvent): StreamEvent {
  switch (event.type) {
    case 'text':
      return { type: 'message.delta', turnId, content: event.content }
    case 'status':
      return { type: 'status', turnId, message: event.message }
    case 'tool.start':
      return { type: 'tool.start', turnId, toolCallId: event.id, name: event.name, input: event.input }
    case 'tool.end':
      return {
        type: 'tool.end',
        turnId,
        toolCallId: event.id,
        output: event.output,
        ...(event.isError === undefined ? {} : { isError: event.isError }),
      }
    case 'metadata':
      return { type: 'status', turnId, message: JSON.stringify(event.data) }
  }
}

export type { ErrorCode }
