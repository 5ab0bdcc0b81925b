import { CairnProblem } from '@cairn/protocol'
import type { Db } from '../db/database.js'
import type { OperatorLimits } from './operator-limits.js'

/**
 * The most manual snapshots (those a user asks for, and the one an import takes first) a session
 * and a tenant may keep. Automatic snapshots have their own keep-last-N retention. Snapshots being
 * taken count as kept, so concurrent requests cannot pass the check together.
 */
export class ManualSnapshotCap {
  private readonly inFlight = new Map<string, number>()
  private readonly bySession
  private readonly byTenant

  constructor(
    db: Db,
    private readonly limits: Pick<
      OperatorLimits,
      'maxManualSnapshotsPerSession' | 'maxManualSnapshotsPerTenant'
    >,
  ) {
    this.bySession = db.prepare<[string], { n: number }>(
      "SELECT COUNT(*) AS n FROM snapshots WHERE session_id = ? AND kind = 'manual' AND deleted_at IS NULL",
    )
    this.byTenant = db.prepare<[string], { n: number }>(
      "SELECT COUNT(*) AS n FROM snapshots WHERE tenant_id = ? AND kind = 'manual' AND deleted_at IS NULL",
    )
  }

  /** Runs `take` (which records one manual snapshot) unless that would pass a cap (`snapshot_limit_reached`). */
  async within<T>(row: { id: string; tenant_id: string }, take: () => Promise<T>): Promise<T> {
    const sessionKey = `s:${row.id}`
    const tenantKey = `t:${row.tenant_id}`
    const session = (this.bySession.get(row.id)?.n ?? 0) + (this.inFlight.get(sessionKey) ?? 0)
    const tenant = (this.byTenant.get(row.tenant_id)?.n ?? 0) + (this.inFlight.get(tenantKey) ?? 0)
    const { maxManualSnapshotsPerSession: perSession, maxManualSnapshotsPerTenant: perTenant } = this.limits
    if (session >= perSession)
      throw new CairnProblem(
        'snapshot_limit_reached',
        `session ${row.id} keeps ${session} manual snapshots, the most this server allows per session (${perSession}, CAIRN_MAX_SNAPSHOTS_PER_SESSION): delete some first`,
        { limit: 'maxManualSnapshotsPerSession', value: session, ceiling: perSession },
      )
    if (tenant >= perTenant)
      throw new CairnProblem(
        'snapshot_limit_reached',
        `this tenant keeps ${tenant} manual snapshots, the most this server allows per tenant (${perTenant}, CAIRN_MAX_SNAPSHOTS_PER_TENANT): delete some (or sessions) first`,
        { limit: 'maxManualSnapshotsPerTenant', value: tenant, ceiling: perTenant },
      )
    const bump = (key: string, by: number) => {
      const next = (this.inFlight.get(key) ?? 0) + by
      if (next === 0) this.inFlight.delete(key)
      else this.inFlight.set(key, next)
    }
    bump(sessionKey, 1)
    bump(tenantKey, 1)
    try {
      return await take()
    } finally {
      bump(sessionKey, -1)
      bump(tenantKey, -1)
    }
  }
}
