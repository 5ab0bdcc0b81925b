import {
  type ApprovalAnswer,
  CairnProblem,
  newId,
  type SessionStatus,
  STATUS_CAUSES,
  type StatusCause,
  type StreamEvent,
} from '@cairn/protocol'
import type { AgentEvent, AgentInfo, TurnEnd, TurnInput, TurnOptions, TurnOutcome } from '@cairn/runtime/port'
import { Redactor } from '@cairn/runtime/port'
import { iso } from '../clock.js'
import { unavailableReason, whenNotBusy } from '../db/busy.js'
import type { TurnDraw } from '../limits/turn-admission.js'
import { needsSetup } from '../setup/setup-service.js'
import type { WorkspaceGenerations } from './generations.js'
import { awaitNodeVerdict } from './node-verdict.js'
import { limitReached } from './policy.js'
import type { SessionServiceDeps } from './session-deps.js'
import { type ApprovalAsked, type MarkAnswer, turnMarkOf, unchangedByAll } from './session-observer.js'
import type { SessionRow, SessionStore, TurnSessionRow } from './session-store.js'
import { END_UNRESERVED_BYTES, recordTurnEnd, type TurnEmit } from './turn-end-record.js'
import type { TurnEventLog, TurnEvents } from './turn-events.js'
import { MOVE_OPERATION, type TurnLocks, TurnStop } from './turn-locks.js'
import { TurnRedaction } from './turn-redaction.js'
import type { SeenAgent, WarmAgents } from './warm-agents.js'

export type TurnRunnerDeps = Pick<
  SessionServiceDeps,
  | 'db'
  | 'runtime'
  | 'secrets'
  | 'setup'
  | 'metrics'
  | 'memory'
  | 'clock'
  | 'logger'
  | 'observers'
  | 'relays'
  | 'routing'
  | 'storageBudget'
  | 'turnAdmission'
> & {
  store: SessionStore
  locks: TurnLocks
  warm: WarmAgents
  generations: WorkspaceGenerations
  events: TurnEvents
}

export type { TurnEmit } from './turn-end-record.js'

const TITLE_MAX = 60
/** Below this much free space, an agent's ENOSPC is blamed on the pool. */
const POOL_FULL_BYTES = 16 * 1024 * 1024

/** A turn accepted by `beginTurn`: validation is over, the lock is held, `run` streams it. */
export interface TurnHandle {
  readonly turnId: string
  run(emit: TurnEmit): Promise<void>
}

/**
 * One turn of a session, from the message to the outcome recorded: the lock taken, the setup
 * phase and the (warm or cold) agent, the streamed reply, then the turn's entry, the session's
 * status and the workspace generation in one transaction.
 */
export class TurnRunner {
  constructor(private readonly deps: TurnRunnerDeps) {}

  private get observers() {
    return this.deps.observers ?? []
  }

  private now(): string {
    return iso(this.deps.clock.now())
  }

  /**
   * Validates and locks before anything is streamed: a second message for the same session is
   * refused with `session_busy`, by the turn lock in this process or, from another replica, by the
   * database (one running turn per session). `load` reads the session's row once the lock is
   * held, so what the turn starts from is not older than the turn before it.
   */
  async begin(
    id: string,
    load: () => Promise<TurnSessionRow>,
    prompt: string,
    seen?: SeenAgent,
  ): Promise<TurnHandle> {
    const { store, locks } = this.deps
    if (locks.has(id)) {
      // Whoever cannot see the session is told it does not exist, not that it is busy.
      await load()
      if (locks.busyWith(id) === MOVE_OPERATION)
        throw new CairnProblem(
          'session_moving',
          `session ${id} is being moved to another node; retry in a moment`,
        )
      throw new CairnProblem(
        'session_busy',
        `session ${id} is already running a turn; wait for it or cancel it`,
        {
          turnId: locks.get(id)?.turnId,
        },
      )
    }
    const turnId = newId('turn')
    const abort = new AbortController()
    const lockRelease = locks.take(id, turnId, abort)
    let admitted: () => Promise<void> = async () => undefined
    const promptBytes = Buffer.byteLength(prompt)
    let draw: TurnDraw | undefined
    const release = () => {
      lockRelease()
      // Ended without its end recorded (refused, failed before it): all it drew counts as kept.
      draw?.end(promptBytes + END_UNRESERVED_BYTES)
      void admitted().catch((error: unknown) =>
        this.deps.logger.warn({ err: error, session: id }, 'releasing a sandbox admission failed'),
      )
    }
    let row: TurnSessionRow
    let seq: number
    /** The owner epoch the turn began under (the row may have been read before another replica moved it). */
    let ownerEpoch = 0
    try {
      row = await load()
      if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${id} was deleted`)
      if (!prompt.trim()) throw new CairnProblem('validation_failed', 'prompt must not be empty')
      await this.checkLimits(row)
      draw = await this.deps.turnAdmission?.admit(row.tenant_id, promptBytes + END_UNRESERVED_BYTES)
      admitted = await this.deps.warm.admit(row, seen, abort.signal)
      const at = this.now()
      seq = row.turn_count + 1
      const current = row
      const startTurn = async () => {
        const begun = await store.startTurn({
          sessionId: id,
          turnId,
          seq,
          prompt,
          title: prompt.replace(/\s+/g, ' ').trim().slice(0, TITLE_MAX),
          at,
          relayId: this.deps.relays?.relayId ?? null,
          sandboxId: warmSandboxOf(seen),
        })
        ownerEpoch = begun.ownerEpoch
      }
      // All or nothing: a database locked by another writer refuses the whole message (503
      // unavailable), never half of it.
      if (current.status === 'idle') await startTurn()
      else
        await this.deps.db.transaction(async () => {
          // Messaging a completed, failed or timed-out session resumes it on its workspace (one
          // that a policy limit stopped was refused above: only an explicit resume brings it back).
          await store.transition(current, 'idle', 'user_resume', at, 'message sent')
          await startTurn()
        })
    } catch (error) {
      draw?.end(0) // nothing of the turn was recorded
      release()
      throw error
    }
    const started: TurnSessionRow = { ...row, status: 'active', owner_epoch: ownerEpoch }
    // Refused room for its events (the tenant's storage budget), the turn stops and fails quota_exceeded.
    const log = this.deps.events.open(turnId, {
      tenantId: row.tenant_id,
      refused: (problem) => abort.abort(new TurnStop('quota_exceeded', problem.message)),
    })
    // The answer to the agent's approval request (or its expiry) goes with the first turn after it.
    const approval = row.approval_id ? await this.approvalFor(started, turnId) : undefined
    const message = { prompt, approval, admittedAs: draw && { draw, promptBytes } }
    return {
      turnId,
      run: async (emit) => {
        try {
          await this.run(started, turnId, seq, message, seen, abort.signal, emit, log)
        } finally {
          release()
        }
      },
    }
  }

  /** The approval answer the turn carries, claimed for it; never throws (the turn is recorded already). */
  private async approvalFor(row: TurnSessionRow, turnId: string): Promise<ApprovalAnswer | undefined> {
    for (const observer of this.observers) {
      if (!observer.approvalFor) continue
      try {
        const answer = await observer.approvalFor(row, turnId)
        if (answer) return answer
      } catch (error) {
        this.deps.logger.warn({ err: error, session: row.id }, 'reading the approval answer failed')
      }
    }
    return undefined
  }

  /** The agent's approval request recorded (its review snapshot first); a failure is logged. */
  private async recordApproval(row: TurnSessionRow, asked: ApprovalAsked): Promise<void> {
    for (const observer of this.observers) {
      await observer
        .approvalRequested?.(row, asked)
        .catch((error: unknown) =>
          this.deps.logger.warn({ err: error, session: row.id }, 'recording the approval request failed'),
        )
    }
  }

  /** Refuses a message that the session's policy no longer allows. */
  private async checkLimits(row: SessionRow): Promise<void> {
    const nowMs = this.deps.clock.now()
    const hit = limitReached(row, nowMs)
    if (!hit) return
    if (hit.timeoutNow)
      await this.deps.store.transition(
        row,
        'timeout',
        'max_duration',
        iso(nowMs),
        `maxDurationMs ${row.max_duration_ms}`,
      )
    throw hit.problem
  }

  /**
   * Runs the turn through the port in one call: its events go to `onEvent` as they come,
   * `onStarted` hears of the warm agent a `resume` took, `signal` cancels it (by turn ID, as a
   * remote runtime is told). `cold`: `resume` found no warm agent (nothing ran).
   */
  private async runTurn(
    sessionId: string,
    input: TurnInput,
    options: TurnOptions,
    signal: AbortSignal,
    onStarted: (agent: AgentInfo) => Promise<void>,
    onEvent: (event: AgentEvent) => Promise<void> | undefined,
  ): Promise<TurnEnd | { type: 'cold'; stopped: boolean }> {
    const { runtime } = this.deps
    const cancel = () => {
      void runtime
        .cancelTurn(sessionId, input.turnId)
        .catch((error: unknown) =>
          this.deps.logger.warn({ err: error, session: sessionId }, 'cancelling a turn failed'),
        )
    }
    const messages = runtime.runTurn(sessionId, input, options)
    signal.addEventListener('abort', cancel, { once: true })
    try {
      if (signal.aborted) cancel()
      let end: TurnEnd | undefined
      for await (const message of messages) {
        if (message.type === 'event') {
          // Back-pressure: the runtime's queue fills meanwhile and pauses the agent. A cancel
          // does not wait for a client that reads nothing.
          const behind = onEvent(message.event)
          if (behind && !signal.aborted) await untilAborted(behind, signal)
        } else if (message.type === 'started') await onStarted(message.agent)
        else if (message.type === 'cold') {
          if (message.stopped) this.deps.warm.forget(sessionId)
          return message
        } else end = message
      }
      if (!end) throw new Error('the turn ended without an outcome')
      return end
    } finally {
      signal.removeEventListener('abort', cancel)
    }
  }

  private async run(
    row: TurnSessionRow,
    turnId: string,
    seq: number,
    message: {
      prompt: string
      approval: ApprovalAnswer | undefined
      admittedAs: { draw: TurnDraw; promptBytes: number } | undefined
    },
    seen: SeenAgent | undefined,
    signal: AbortSignal,
    emitNumbered: TurnEmit,
    log: TurnEventLog,
  ): Promise<void> {
    const { prompt, approval } = message
    /** The agent's approval request of this turn (the last one, if it asked twice). */
    let asked: ApprovalAsked | undefined
    const { store, warm } = this.deps
    const emit = (event: StreamEvent) => both(emitNumbered(event, log.append(event)), log.room())
    const startedAt = this.deps.clock.now()
    const elapsed = () => Math.max(0, Math.round(performance.now() - startedPerf))
    const startedPerf = performance.now()
    let outcome: TurnOutcome
    let sandboxId = ''
    let promptSent = false
    /**
     * The session's agent once the turn is over (read once: the runtime may be a round trip away,
     * and nothing but this turn stops it meanwhile; its cooldown has just begun).
     */
    let agentAfter: AgentInfo | undefined
    /** The runtime's answer, after the turn, to the workspace mark sent with it. */
    let answered: MarkAnswer | undefined
    const maxTurns = row.max_turns
    const lastTurn = maxTurns !== null && seq >= maxTurns
    let redactor = new Redactor({})
    /** The turn's events, redacted; the reply's text it holds back goes out before the turn's end. */
    let redacted: TurnRedaction | undefined
    try {
      // The setup phase runs before the agent's sandbox exists: the agent never shares a process
      // tree, an environment or a /proc with the setup secrets.
      const setup = this.deps.setup
      let warmNow = seen ? seen.agent?.alive === true : true
      if (warmNow && warm.secretsExpired(row.id)) {
        await warm.drop(row.id)
        warmNow = false
      }
      if (setup && needsSetup(row.setup_status)) {
        await warm.drop(row.id)
        await setup.run(row, signal)
        warmNow = false
      }
      // A cold agent starts before the pre-turn snapshot: the snapshot's mark then names its
      // sandbox, so a turn that changes nothing keeps the generation and needs no new snapshot.
      const coldStart = warmNow ? undefined : await warm.start(row, seen?.agent !== undefined, signal)
      for (const observer of this.observers) await observer.beforeTurn?.(row, seq)
      const transcript = await warm.transcripts.before(row.id, seq)
      redactor = new Redactor(await this.deps.secrets.values(row.agent_id, ['runtime', 'setup', 'proxy']))
      const events = new TurnRedaction(redactor, turnId, emit)
      redacted = events
      const onEvent = (event: AgentEvent) => {
        if (event.type !== 'approval.request') return events.event(toStreamEvent(turnId, event))
        const { summary, action } = event
        asked = { id: newId('approval'), turnId, seq, summary: redactor.redact(summary) }
        if (action !== undefined) asked.action = events.redactValues(action)
        return events.event({ type: 'approval.requested', turnId, approvalId: asked.id, summary, action })
      }
      const started = async (agent: AgentInfo, cold: boolean) => {
        sandboxId = agent.sandboxId
        // The turn's row names the warm sandbox `begin` saw: written again only if it ran elsewhere.
        if (cold || sandboxId !== warmSandboxOf(seen))
          await whenNotBusy(() => store.setTurnSandbox(turnId, sandboxId, cold))
        emit({ type: 'run.started', sessionId: row.id, turnId, turn: seq, sandboxId, coldStart: cold })
        promptSent = true
      }
      const input: TurnInput = { prompt, turn: seq, turnId, transcript, ...(approval ? { approval } : {}) }
      // One call to the runtime: the warm agent taken, the turn, its sandbox cooled down after it
      // (the policy's last turn drops it below instead).
      // The workspace's mark goes with it: the node says whether the turn changed it.
      const mark = lastTurn ? undefined : turnMarkOf(this.observers, row.id)
      const options: TurnOptions = lastTurn ? {} : { keepWarmMs: row.keep_warm_ms, mark }
      const resumed = warmNow
      let end = resumed
        ? await this.runTurn(
            row.id,
            input,
            { ...options, resume: true },
            signal,
            (agent) => started(agent, false),
            onEvent,
          )
        : undefined
      if (end?.type !== 'outcome') {
        // Cold (started above, or the one seen warm was gone or dead at the resume, which stopped it).
        const { agent, cold } =
          coldStart ?? (await warm.restart(row, end?.stopped ?? false, this.deps.generations, signal))
        await started(agent, cold)
        end = await this.runTurn(row.id, input, options, signal, async () => undefined, onEvent)
      }
      if (end.type !== 'outcome') throw new Error('the agent just started is not warm')
      outcome = end.outcome
      outcome = {
        ...outcome,
        text: redactor.redact(outcome.text),
        stderr: redactor.redact(outcome.stderr),
      }
      if (outcome.status === 'failed') {
        outcome = { ...outcome, message: redactor.redact(outcome.message) }
        outcome = await this.blamePoolIfFull(outcome)
      }
      if (end.after) {
        agentAfter = end.after.agent
        if (mark && end.after.unchanged !== undefined) answered = { mark, unchanged: end.after.unchanged }
        if (!agentAfter) warm.forget(row.id)
      } else if (!lastTurn) {
        // A runtime that did not do the after-turn step itself.
        agentAfter = await this.afterTurn(row.id, () => warm.agent(row.id), undefined)
        if (!agentAfter?.alive) {
          await this.afterTurn(row.id, () => warm.drop(row.id), undefined)
          agentAfter = undefined
        } else await this.afterTurn(row.id, () => warm.scheduleCooldown(row), undefined)
      }
    } catch (error) {
      outcome = failedOutcome(error, signal)
      if (!sandboxId)
        emit({ type: 'run.started', sessionId: row.id, turnId, turn: seq, sandboxId: '', coldStart: true })
      await this.afterTurn(row.id, () => warm.drop(row.id), undefined)
      agentAfter = undefined
    }
    redacted?.flush()
    outcome = stoppedAs(signal, outcome)
    const durationMs = elapsed()
    const endedAt = iso(Math.max(this.deps.clock.now(), startedAt))
    warm.transcripts.remember(row.id, seq, prompt, outcome.text)
    this.deps.metrics?.turns.inc({ outcome: outcome.status })
    this.deps.metrics?.turnSeconds.observe(durationMs / 1000)
    const failed = outcome.status === 'failed' ? outcome : undefined
    const endedAs: SessionStatus = failed ? 'failed' : 'idle'
    const cause = endCause(outcome)
    // Whatever the agent did to the workspace is a new generation (a turn that provably changed
    // nothing keeps it, so its unchanged subvolume needs no snapshot): the marker in the pool first
    // (a crash after it leaves the disk ahead, never behind), so the snapshot that follows the
    // turn carries it.
    let generation: number | undefined
    const unchanged =
      promptSent && agentAfter?.alive
        ? await unchangedByAll(this.observers, row.id, answered).catch(() => false)
        : false
    if (promptSent && !unchanged) {
      generation = await this.deps.generations.markNext(row.id).catch((error) => {
        this.deps.logger.warn({ err: error, session: row.id }, 'workspace generation not advanced')
        return undefined
      })
    }
    if (failed?.code === 'node_unavailable')
      await awaitNodeVerdict(store, row, this.deps.routing?.nodeVerdictMs)
    // The policy's last turn ends the session; its sandbox goes before the reply's end is sent.
    if (lastTurn) {
      await this.afterTurn(row.id, () => warm.drop(row.id), undefined)
      agentAfter = undefined
    }
    if (asked && outcome.status === 'completed') await this.recordApproval(row, asked)
    warm.noteTurnEnd(row, agentAfter)
    const recorded = await recordTurnEnd(
      { db: this.deps.db, store, logger: this.deps.logger, budget: this.deps.storageBudget },
      {
        ...{ row, turnId, seq, outcome, durationMs, endedAt, endedAs, cause, generation, lastTurn, log },
        admitted: message.admittedAs,
      },
      emitNumbered,
    )
    if (!recorded) return
    const after = agentAfter
    for (const observer of this.observers) observer.afterTurn?.(row, seq, after, unchanged)
    // A proposed memory appears by a change to the workspace: after a turn that changed nothing
    // since the last snapshot (the last look), there is nothing new to look at.
    const memory = this.deps.memory
    if (memory && !unchanged) {
      void memory
        .promoteProposed(row.agent_id, row.id, `${row.id}/${turnId}`)
        .catch((error) => this.deps.logger.warn({ err: error, session: row.id }, 'memory promotion failed'))
    }
  }

  /**
   * A step after the agent answered (its sandbox's state, a stop): the turn's end is recorded and
   * told whatever becomes of it. Its node may be gone by then (lost, unreachable): that is
   * logged and `fallback` stands in.
   */
  private async afterTurn<T>(sessionId: string, step: () => Promise<T>, fallback: T): Promise<T> {
    try {
      return await step()
    } catch (error) {
      this.deps.logger.warn({ err: error, session: sessionId }, 'a step after the turn failed')
      return fallback
    }
  }

  /**
   * An agent that fell over on `ENOSPC` while the pool is (nearly) full did not crash on its own:
   * the turn is reported as `storage_error` with the pool's figures, so the fix (free space) is clear.
   */
  private async blamePoolIfFull(outcome: Extract<TurnOutcome, { status: 'failed' }>): Promise<TurnOutcome> {
    const said = `${outcome.message}\n${outcome.stderr}`
    // A quota is this session's (or its tenant's) alone: a typed error, nothing about the pool.
    if (/Disk quota exceeded|EDQUOT/.test(said)) {
      return {
        ...outcome,
        code: 'quota_exceeded',
        cause: 'quota_exceeded',
        message: `the storage quota is used up: the agent's writes failed with "Disk quota exceeded" (the workspace limit, or the tenant's total of workspaces and snapshots); delete files or snapshots, then resume the session. Agent: ${outcome.message}`,
      }
    }
    if (!/No space left on device|ENOSPC/.test(said)) return outcome
    // Without the pool's figures the agent's own failure is reported as it is.
    const stats = await this.deps.runtime.poolStats().catch((error: unknown) => {
      this.deps.logger.warn({ err: error }, 'reading the pool usage failed')
      return undefined
    })
    if (!stats || stats.freeBytes > POOL_FULL_BYTES) return outcome
    return {
      ...outcome,
      code: 'storage_error',
      cause: 'storage_error',
      message: `the storage pool is full (${stats.freeBytes} of ${stats.totalBytes} bytes free): the agent's writes failed with "No space left on device"; free space in the pool, then resume the session. Agent: ${outcome.message}`,
    }
  }
}

/** What a turn that threw ended as: cancelled when it was cancelled, else failed with the error's code. */
function failedOutcome(error: unknown, signal: AbortSignal): TurnOutcome {
  const problem = error instanceof CairnProblem ? error : undefined
  const setupFailed = problem?.code === 'setup_failed' || problem?.code === 'resume_failed'
  if (signal.aborted) return { status: 'cancelled', text: '', stderr: '' }
  return {
    status: 'failed',
    code: problem?.code ?? (unavailableReason(error) ? 'unavailable' : 'sandbox_failed'),
    cause: causeOfProblem(problem),
    message: problem?.message ?? `the sandbox could not start: ${(error as Error).message}`,
    text: '',
    stderr: setupFailed ? String(problem.details?.logTail ?? '') : '',
  }
}

/**
 * The session's status cause for a turn that threw `problem`: its code where that code names a
 * cause (setup_failed, state_lost, quota_exceeded, node_lost, …); `moved` for a turn the session's
 * move outran (`stale_epoch` from every node asked); `turn_failed` for no sandbox to be had (see
 * `WarmAgents.restart`); else the agent's crash.
 */
export function causeOfProblem(problem: CairnProblem | undefined): StatusCause {
  const code: string | undefined = problem?.code
  if (code === 'stale_epoch') return 'moved'
  if (code === 'sandbox_limit_reached') return 'turn_failed'
  return STATUS_CAUSES.find((cause) => cause === code) ?? 'agent_crash'
}

/** The cause of the session's status change a turn's end makes. */
function endCause(outcome: TurnOutcome): StatusCause {
  if (outcome.status === 'failed') return outcome.cause
  if (outcome.status === 'cancelled') return 'turn_cancelled'
  return outcome.agentExited ? 'agent_exit' : 'turn_completed'
}

/** One promise of two waits (either may be none). */
function both(a: Promise<void> | undefined, b: Promise<void> | undefined): Promise<void> | undefined {
  if (!a || !b) return a ?? b
  return Promise.all([a, b]).then(() => undefined)
}

/** `wait`, or until `signal` aborts, whichever is first. */
function untilAborted(wait: Promise<void>, signal: AbortSignal): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      signal.removeEventListener('abort', done)
      resolve()
    }
    signal.addEventListener('abort', done, { once: true })
    void wait.then(done, done)
  })
}

/** The sandbox of the warm agent seen before the turn began, if it was alive. */
function warmSandboxOf(seen: SeenAgent | undefined): string | undefined {
  return seen?.agent?.alive ? seen.agent.sandboxId : undefined
}

/**
 * A turn its own process ended (an API replica stopping, its events refused by the tenant's
 * storage budget: `TurnStop`) fails with that code and cause, not as a user's cancel.
 */
function stoppedAs(signal: AbortSignal, outcome: TurnOutcome): TurnOutcome {
  const stop: unknown = signal.aborted ? signal.reason : undefined
  if (!(stop instanceof TurnStop) || outcome.status !== 'cancelled') return outcome
  return {
    status: 'failed',
    code: stop.code,
    cause: stop.code,
    message: stop.message,
    text: outcome.text,
    stderr: outcome.stderr,
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
    case 'approval.request':
      throw new Error('approval requests are recorded by the turn, not mapped')
  }
}
