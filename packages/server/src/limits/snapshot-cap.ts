import { CairnProblem, newId } from '@cairn/protocol'
import type { Db } from '../db/database.js'
import type { OperatorLimits } from './operator-limits.js'

/** A snapshot admitted and being taken: its ID is known before its row is written. */
interface Taking {
  snapshotId: string
  sessionId: string
  tenantId: string
}

/**
 * The most manual snapshots (those a user asks for, and the one an import takes first) a session
 * and a tenant may keep. Automatic snapshots have their own keep-last-N retention. Snapshots being
 * taken count as kept, so concurrent requests cannot pass the check together. Each is counted
 * once: the snapshots being taken are read before the count and their rows left out of it, so one
 * whose row is written and whose mark is dropped while the count runs (on PostgreSQL, another
 * connection's commit the count did not see) is still counted, and one already written is not
 * counted twice.
 */
export class ManualSnapshotCap {
  private readonly taking = new Set<Taking>()
  /** Checks run one at a time: a count read and the in-flight mark it leads to are not split. */
  private checks: Promise<unknown> = Promise.resolve()

  constructor(
    private readonly db: Db,
    private readonly limits: Pick<
      OperatorLimits,
      'maxManualSnapshotsPerSession' | 'maxManualSnapshotsPerTenant'
    >,
  ) {}

  /** Runs `take` with the ID its snapshot must have, once the caps admit one more snapshot. */
  async within<T>(
    row: { id: string; tenant_id: string },
    take: (snapshotId: string) => Promise<T>,
  ): Promise<T> {
    const admitted = this.checks.then(() => this.admit(row))
    this.checks = admitted.catch(() => undefined)
    const taking = await admitted
    try {
      return await take(taking.snapshotId)
    } finally {
      this.taking.delete(taking)
    }
  }

  /** Checks the caps and counts one more snapshot being taken (until `within` drops it). */
  private async admit(row: { id: string; tenant_id: string }): Promise<Taking> {
    // Read before the counts: checks run one at a time, so none is added while they run.
    const taking = [...this.taking]
    const ofSession = taking.filter((t) => t.sessionId === row.id).map((t) => t.snapshotId)
    const ofTenant = taking.filter((t) => t.tenantId === row.tenant_id).map((t) => t.snapshotId)
    const session = (await this.manual('session_id', row.id, ofSession)) + ofSession.length
    const tenant = (await this.manual('tenant_id', row.tenant_id, ofTenant)) + ofTenant.length
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
    const admitted = { snapshotId: newId('snapshot'), sessionId: row.id, tenantId: row.tenant_id }
    this.taking.add(admitted)
    return admitted
  }

  /** Manual snapshots kept, leaving out the rows of those counted as being taken. */
  private async manual(column: 'session_id' | 'tenant_id', id: string, taking: string[]): Promise<number> {
    let query = this.db.q
      .selectFrom('snapshots')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .where(column, '=', id)
      .where('kind', '=', 'manual')
      .where('deleted_at', 'is', null)
    if (taking.length > 0) query = query.where('id', 'not in', taking)
    const row = await query.executeTakeFirst()
    return Number(row?.n ?? 0)
  }
}
