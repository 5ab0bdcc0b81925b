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
  /** Checks run one at a time: a count read and the in-flight mark it leads to are not split. */
  private checks: Promise<unknown> = Promise.resolve()

  constructor(
    private readonly db: Db,
    private readonly limits: Pick<
      OperatorLimits,
      'maxManualSnapshotsPerSession' | 'maxManualSnapshotsPerTenant'
    >,
  ) {}

  async within<T>(row: { id: string; tenant_id: string }, take: () => Promise<T>): Promise<T> {
    const admitted = this.checks.then(() => this.admit(row))
    this.checks = admitted.catch(() => undefined)
    const release = await admitted
    try {
      return await take()
    } finally {
      release()
    }
  }

  /** Checks the caps and counts one more snapshot in flight; the returned function uncounts it. */
  private async admit(row: { id: string; tenant_id: string }): Promise<() => void> {
    const sessionKey = `s:${row.id}`
    const tenantKey = `t:${row.tenant_id}`
    const session = (await this.manual('session_id', row.id)) + (this.inFlight.get(sessionKey) ?? 0)
    const tenant = (await this.manual('tenant_id', row.tenant_id)) + (this.inFlight.get(tenantKey) ?? 0)
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
    return () => {
      bump(sessionKey, -1)
      bump(tenantKey, -1)
    }
  }

  private async manual(column: 'session_id' | 'tenant_id', id: string): Promise<number> {
    const row = await this.db.q
      .selectFrom('snapshots')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .where(column, '=', id)
      .where('kind', '=', 'manual')
      .where('deleted_at', 'is', null)
      .executeTakeFirst()
    return Number(row?.n ?? 0)
  }
}
