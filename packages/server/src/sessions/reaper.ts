import { iso } from '../clock.js'
import type { SessionServiceDeps } from './session-deps.js'
import type { SessionRow, SessionStore } from './session-store.js'
import type { TurnLocks } from './turn-locks.js'
import type { WarmAgents } from './warm-agents.js'

export type SessionReaperDeps = Pick<SessionServiceDeps, 'clock' | 'logger'> & {
  store: SessionStore
  locks: TurnLocks
  warm: WarmAgents
  /** Deletes a session (`SessionService.delete`), for `onTimeout: destroy`. */
  deleteSession: (
    tenantId: string,
    id: string,
    cause: 'idle_timeout' | 'max_duration',
    detail: string,
  ) => Promise<void>
}

/**
 * The policy timeouts, checked on an interval: sessions idle past their `idleTimeoutMs` and
 * sessions past their `maxDurationMs` time out (and, with `onTimeout: destroy`, are deleted).
 */
export class SessionReaper {
  private timer: NodeJS.Timeout | undefined

  constructor(private readonly deps: SessionReaperDeps) {}

  private now(): string {
    return iso(this.deps.clock.now())
  }

  /** Reaps every `intervalMs`, then runs `more` (other services' sweeps); a round never overlaps the last. */
  start(intervalMs: number, more?: () => Promise<unknown>): void {
    let busy = false
    this.timer = setInterval(() => {
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
    this.timer.unref()
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer)
  }

  async reapIdle(): Promise<number> {
    const { store, locks, warm } = this.deps
    const expired = store.expiredIdle(this.deps.clock.now())
    for (const { id, tenant_id } of expired) {
      if (locks.has(id)) continue
      await warm.drop(id)
      const row = store.get(tenant_id, id)
      if (row?.status !== 'idle') continue
      store.transition(row, 'timeout', 'idle_timeout', this.now(), `idle for ${row.idle_timeout_ms} ms`)
      await this.destroyOnTimeout(row, 'idle_timeout')
    }
    return expired.length
  }

  /** Sessions past their `maxDurationMs`: a running turn is cancelled, the session times out. */
  async reapDeadlines(): Promise<number> {
    const { store, locks, warm } = this.deps
    const expired = store.pastDeadline(this.now())
    for (const { id, tenant_id } of expired) {
      await locks.cancel(id)
      await warm.drop(id)
      const row = store.get(tenant_id, id)
      if (row?.status !== 'idle') continue
      store.transition(
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
    await this.deps.deleteSession(row.tenant_id, row.id, cause, 'policy onTimeout: destroy')
  }
}
