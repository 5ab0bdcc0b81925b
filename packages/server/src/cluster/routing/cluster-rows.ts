import { CairnProblem } from '@cairn/protocol'
import type { Db } from '../../db/database.js'
import { RecentMap } from './recent-map.js'

/** Where a session lives: its node (`sessions.runtime_id`) and the owner epoch its calls carry. */
export interface SessionHome {
  nodeId: string
  ownerEpoch: number
}

/**
 * What routing reads from the database, each briefly cached (`cacheMs`): a session's node and
 * owner epoch, a snapshot's session, the nodes holding a revision; plus what this replica placed
 * a moment ago and the database does not say yet (a session's workspace is made before its row).
 */
export class ClusterRows {
  private readonly homes: RecentMap<string, SessionHome>
  /** Sessions placed here whose rows are not written yet (new sessions, forks). */
  private readonly placed: RecentMap<string, string>
  /** A snapshot's session never changes: kept longer. */
  private readonly snapshotSessions: RecentMap<string, string>
  private readonly holders: RecentMap<string, string[]>

  constructor(
    private readonly db: Db,
    cacheMs: number,
    now: () => number,
  ) {
    this.homes = new RecentMap(cacheMs, now)
    this.placed = new RecentMap(10 * 60_000, now)
    this.snapshotSessions = new RecentMap(10 * 60_000, now)
    this.holders = new RecentMap(cacheMs, now)
  }

  /** Records that the new session `sessionId` was placed on `nodeId` (its row follows). */
  notePlaced(sessionId: string, nodeId: string): void {
    this.placed.set(sessionId, nodeId)
  }

  /** The node a session was placed on by this replica, until its row says so. */
  placedNode(sessionId: string): string | undefined {
    return this.placed.get(sessionId)
  }

  noteSnapshot(snapshotId: string, sessionId: string): void {
    this.snapshotSessions.set(snapshotId, sessionId)
  }

  /** Forgets the cached home (an answer said the owner moved: read it again). */
  forget(sessionId: string): void {
    this.homes.delete(sessionId)
  }

  async home(sessionId: string): Promise<SessionHome> {
    const cached = this.homes.get(sessionId)
    if (cached) return cached
    const row = await this.db.q
      .selectFrom('sessions')
      .select(['runtime_id', 'owner_epoch'])
      .where('id', '=', sessionId)
      .executeTakeFirst()
    const placedOn = this.placedNode(sessionId)
    if (!row) {
      // Placed here a moment ago, its row not written yet: a new session's epoch is 0.
      if (placedOn) return { nodeId: placedOn, ownerEpoch: 0 }
      throw new CairnProblem('session_not_found', `no session ${sessionId}`)
    }
    if (row.runtime_id === null)
      throw new CairnProblem(
        'node_unavailable',
        `session ${sessionId} has no node (a row from before the cluster); start it on a server with a local runtime once`,
      )
    this.placed.delete(sessionId)
    const home = { nodeId: row.runtime_id, ownerEpoch: Number(row.owner_epoch) }
    this.homes.set(sessionId, home)
    return home
  }

  /** The session a snapshot belongs to (its workspace's node holds it). */
  async snapshotSession(snapshotId: string): Promise<string> {
    const known = this.snapshotSessions.get(snapshotId)
    if (known) return known
    const row = await this.db.q
      .selectFrom('snapshots')
      .select('session_id')
      .where('id', '=', snapshotId)
      .executeTakeFirst()
    if (!row) throw new CairnProblem('not_found', `no snapshot ${snapshotId}`)
    this.snapshotSessions.set(snapshotId, row.session_id)
    return row.session_id
  }

  /** The nodes that hold the revision (and its dependency environment). */
  async revisionHolders(revisionId: string, fresh = false): Promise<string[]> {
    const cached = fresh ? undefined : this.holders.get(revisionId)
    if (cached) return cached
    const rows = await this.db.q
      .selectFrom('revision_nodes')
      .select('runtime_id')
      .where('revision_id', '=', revisionId)
      .execute()
    const ids = rows.map((row) => row.runtime_id)
    this.holders.set(revisionId, ids)
    return ids
  }

  async addRevisionHolder(revisionId: string, nodeId: string): Promise<void> {
    await this.db.q
      .insertInto('revision_nodes')
      .values({ revision_id: revisionId, runtime_id: nodeId })
      .onConflict((conflict) => conflict.columns(['revision_id', 'runtime_id']).doNothing())
      .execute()
    this.holders.delete(revisionId)
  }

  /** What placement and shipping need of a revision: its driver and its dependency environment. */
  async revisionFacts(
    revisionId: string,
  ): Promise<{ isolation: string | undefined; envKey: string | undefined; tenantId: string }> {
    const row = await this.db.q
      .selectFrom('revisions')
      .select(['manifest_json', 'tenant_id'])
      .where('id', '=', revisionId)
      .executeTakeFirst()
    if (!row) throw new CairnProblem('revision_not_found', `revision ${revisionId} is gone`)
    const manifest = JSON.parse(row.manifest_json) as { isolation?: unknown; envKey?: unknown }
    return {
      isolation: typeof manifest.isolation === 'string' ? manifest.isolation : undefined,
      envKey: typeof manifest.envKey === 'string' ? manifest.envKey : undefined,
      tenantId: row.tenant_id,
    }
  }
}
