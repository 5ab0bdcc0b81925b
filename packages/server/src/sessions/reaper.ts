import { iso } from '../clock.js'
import type { DueCursor, DueRow } from './deadline-index.js'
import type { SessionServiceDeps } from './session-deps.js'
import type { SessionRow, SessionStore } from './session-store.js'
import type { TurnLocks } from './turn-locks.js'
import type { WarmAgents } from './warm-agents.js'

export type SessionReaperDeps = Pick<SessionServiceDeps, 'clock' | 'logger'> & {
  store: SessionStore
  locks: TurnLocks
  /** Only to drop a timed-out session's warm sandbox. */
  warm: Pick<WarmAgents, 'drop'>
  /** Cancels the session's running turn, wherever it runs (`SessionService`); false: none ran. */
  cancelTurn: (sessionId: string) => Promise<boolean>
  /** Deletes a session (`SessionService.delete`), for `onTimeout: destroy`. */
  deleteSession: (
    tenantId: string,
    id: string,
    cause: 'idle_timeout' | 'max_duration',
    detail: string,
  ) => Promise<void>
}

/** What one pass over the due sessions did: sessions it read, and how many it timed out. */
export interface ReapReport {
  considered: number
  timedOut: number
}

/** Sessions read from the deadline index at a time. */
const DUE_BATCH = 100

/** setTimeout's longest delay; a later deadline is re-armed when this one fires. */
const MAX_TIMER_MS = 2 ** 31 - 1
/** How soon a round looks again at a session that was due but could not be timed out yet. */
const STILL_DUE_RETRY_MS = 250

/**
 * The policy timeouts: sessions idle past their `idleTimeoutMs` and sessions past their
 * `maxDurationMs` time out (and, with `onTimeout: destroy`, are deleted). A timer is armed for the
 * next session due (re-armed when a change brings one earlier: see `SessionStore.onTimingChange`),
 * so a timeout fires when it is due; the interval sweep runs the other services' sweeps and
 * catches anything a timer missed.
 */
export class SessionReaper {
  private timer: NodeJS.Timeout | undefined
  private dueTimer: NodeJS.Timeout | undefined
  /** When the armed timer fires (ms, the clock's); Infinity when none is armed. */
  private armedFor = Number.POSITIVE_INFINITY
  private running = false
  private started = false

  constructor(private readonly deps: SessionReaperDeps) {
    deps.store.onTimingChange((sessionId, dueMs) => this.noteTimingChange(sessionId, dueMs))
  }

  private now(): string {
    return iso(this.deps.clock.now())
  }

  /** Arms the deadline timer, and sweeps every `intervalMs` then runs `more` (other services' sweeps). */
  start(intervalMs: number, more?: () => Promise<unknown>): void {
    this.started = true
    this.timer = setInterval(() => void this.round(more), intervalMs)
    this.timer.unref()
    void this.armNext().catch((error: unknown) =>
      this.deps.logger.error({ err: error }, 'reaper could not arm its next deadline'),
    )
  }

  stop(): void {
    this.started = false
    if (this.timer) clearInterval(this.timer)
    if (this.dueTimer) clearTimeout(this.dueTimer)
    this.armedFor = Number.POSITIVE_INFINITY
  }

  /**
   * A session's next timeout may have come earlier: the timer is armed for it if it is (`dueMs`
   * when the change knew it, else read).
   */
  private noteTimingChange(sessionId: string, dueMs?: number): void {
    if (!this.started) return
    const known = dueMs === undefined ? undefined : Promise.resolve(dueMs)
    void (known ?? this.deps.store.deadlines.dueAt(sessionId))
      .then((due) => {
        if (this.started && due !== undefined && due < this.armedFor) this.arm(due)
      })
      .catch((error: unknown) =>
        this.deps.logger.error({ err: error, session: sessionId }, 'reaper could not read a timeout'),
      )
  }

  /**
   * Arms the timer for the earliest timeout of all sessions (after a round, and at the start). One
   * still due after a round (its turn is being cancelled, its lock is held) is tried again a
   * little later, not in a tight loop.
   */
  private async armNext(): Promise<void> {
    if (!this.started) return
    const due = await this.deps.store.deadlines.next()
    if (!this.started) return
    if (due === undefined) {
      if (this.dueTimer) clearTimeout(this.dueTimer)
      this.armedFor = Number.POSITIVE_INFINITY
    } else this.arm(Math.max(due, this.deps.clock.now() + STILL_DUE_RETRY_MS))
  }

  private arm(dueMs: number): void {
    if (this.dueTimer) clearTimeout(this.dueTimer)
    this.armedFor = dueMs
    const delayMs = Math.min(Math.max(0, dueMs - this.deps.clock.now()), MAX_TIMER_MS)
    this.dueTimer = setTimeout(() => {
      this.armedFor = Number.POSITIVE_INFINITY
      void this.round()
    }, delayMs)
    this.dueTimer.unref()
  }

  /** One round of reaping (never two at once); the timer is armed again for what is next. */
  private async round(more?: () => Promise<unknown>): Promise<void> {
    // A round already running arms the timer again when it ends, with whatever came due meanwhile.
    if (this.running) return
    this.running = true
    try {
      await this.reapDue()
      await more?.()
    } catch (error) {
      this.deps.logger.error({ err: error }, 'reaper failed')
    } finally {
      this.running = false
      try {
        await this.armNext()
      } catch (error) {
        this.deps.logger.error({ err: error }, 'reaper could not arm its next deadline')
      }
    }
  }

  /**
   * Times out the sessions due now, read from the deadline index in batches (due first): the
   * sessions not due are never read, and one read as due whose timeout activity moved later has
   * its true time written back, so it is not read again until then.
   */
  async reapDue(): Promise<ReapReport> {
    const { deadlines } = this.deps.store
    const nowMs = this.deps.clock.now()
    const report: ReapReport = { considered: 0, timedOut: 0 }
    let cursor: DueCursor | undefined
    for (;;) {
      const rows = await deadlines.due(nowMs, DUE_BATCH, cursor)
      for (const row of rows) {
        report.considered++
        const cause = timeoutOf(row, nowMs)
        if (cause === undefined) await this.each(row.id, () => deadlines.settle(row))
        else if (await this.timeOut(row, cause)) report.timedOut++
      }
      const last = rows.at(-1)
      if (!last || rows.length < DUE_BATCH) return report
      cursor = { dueAt: last.next_due_at, id: last.id }
    }
  }

  /** One session's timeout; false: it was not timed out (a turn holds it, it changed, it failed). */
  private async timeOut(due: DueRow, cause: 'idle_timeout' | 'max_duration'): Promise<boolean> {
    const { store, locks, warm } = this.deps
    if (cause === 'idle_timeout' && locks.has(due.id)) return false
    let done = false
    await this.each(due.id, async () => {
      if (cause === 'max_duration') await this.deps.cancelTurn(due.id)
      await warm.drop(due.id)
      const row = await store.get(due.tenant_id, due.id)
      if (row?.status !== 'idle') return
      const detail =
        cause === 'idle_timeout'
          ? `idle for ${row.idle_timeout_ms} ms`
          : `maxDurationMs ${row.max_duration_ms} ran out at ${row.deadline_at}`
      await store.transition(row, 'timeout', cause, this.now(), detail)
      done = true
      await this.destroyOnTimeout(row, cause)
    })
    return done
  }

  /**
   * One session's timeout: a failure (its node gone, say) is logged and the round goes on with
   * the others; the session is still due, so a later round tries again.
   */
  private async each(sessionId: string, reap: () => Promise<void>): Promise<void> {
    try {
      await reap()
    } catch (error) {
      this.deps.logger.warn({ err: error, session: sessionId }, 'reaping a session failed')
    }
  }

  /** `onTimeout: destroy`: the workspace and snapshots go at the timeout, the cause recorded. */
  private async destroyOnTimeout(row: SessionRow, cause: 'idle_timeout' | 'max_duration'): Promise<void> {
    if (row.on_timeout !== 'destroy') return
    await this.deps.deleteSession(row.tenant_id, row.id, cause, 'policy onTimeout: destroy')
  }
}

/** Which timeout a session read as due has reached at `nowMs`, if any (the idle one first). */
function timeoutOf(row: DueRow, nowMs: number): 'idle_timeout' | 'max_duration' | undefined {
  const leased = row.lease_until !== null && Date.parse(row.lease_until) > nowMs
  if (row.status === 'idle' && !leased && Date.parse(row.last_active_at) + row.idle_timeout_ms <= nowMs)
    return 'idle_timeout'
  const live = row.status === 'idle' || row.status === 'active'
  if (live && row.deadline_at !== null && Date.parse(row.deadline_at) <= nowMs) return 'max_duration'
  return undefined
}
