import type { SnapshotInfo, SnapshotReason } from '@cairn/protocol'
import { type RawBuilder, sql } from 'kysely'
import type { Db } from '../db/database.js'

interface SnapshotRow {
  id: string
  session_id: string
  tenant_id: string
  kind: 'auto' | 'manual'
  reason: SnapshotReason
  label: string | null
  turn_seq: number
  /** Also the state after turns up to this one (they changed nothing); null: `turn_seq` only. */
  through_turn_seq?: number | null
  generation: number
  digest?: string | null
  created_at: string
}

function toInfo(row: SnapshotRow): SnapshotInfo {
  return {
    id: row.id,
    sessionId: row.session_id,
    kind: row.kind,
    reason: row.reason,
    label: row.label,
    turn: row.turn_seq,
    throughTurn: Math.max(row.turn_seq, row.through_turn_seq ?? row.turn_seq),
    generation: row.generation,
    digest: row.digest ?? null,
    sizes: null,
    createdAt: row.created_at,
  }
}

/** Snapshot records; the subvolumes themselves live in the pool's `snapshots` area. */
export class SnapshotStore {
  constructor(private readonly db: Db) {}

  async insertWithId(id: string, row: Omit<SnapshotRow, 'id'>): Promise<SnapshotInfo> {
    const full = { id, ...row }
    await this.db.q
      .insertInto('snapshots')
      .values({
        id,
        session_id: row.session_id,
        tenant_id: row.tenant_id,
        kind: row.kind,
        reason: row.reason,
        label: row.label,
        turn_seq: row.turn_seq,
        generation: row.generation,
        created_at: row.created_at,
      })
      .execute()
    return toInfo(full)
  }

  private live(sessionId: string) {
    return this.db.q
      .selectFrom('snapshots')
      .selectAll()
      .where('session_id', '=', sessionId)
      .where('deleted_at', 'is', null)
  }

  async get(sessionId: string, id: string): Promise<SnapshotInfo | undefined> {
    const row = await this.live(sessionId).where('id', '=', id).executeTakeFirst()
    return row ? toInfo(row as SnapshotRow) : undefined
  }

  async list(sessionId: string): Promise<SnapshotInfo[]> {
    const rows = await this.live(sessionId).orderBy('created_at').orderBy(sql`rowid`).execute()
    return rows.map((row) => toInfo(row as SnapshotRow))
  }

  /**
   * The newest snapshot that follows `turn` (automatic before-turn ones preferred), including one
   * taken after an earlier turn that stands for this one too (the turns between changed nothing).
   */
  async atTurn(sessionId: string, turn: number): Promise<SnapshotInfo | undefined> {
    const row = await this.live(sessionId)
      .where(standingFor(sql`${turn}`))
      .orderBy(sql`(reason = 'before_turn')`, 'desc')
      .orderBy('turn_seq', 'desc')
      .orderBy('created_at', 'desc')
      .orderBy(sql`rowid`, 'desc')
      .limit(1)
      .executeTakeFirst()
    return row ? toInfo(row as SnapshotRow) : undefined
  }

  /**
   * Records that the snapshot is also the state after `turn` (the turns since it was taken changed
   * nothing). False when the snapshot is gone (pruned or deleted): take a new one.
   */
  async extendThrough(id: string, turn: number): Promise<boolean> {
    // After every warm turn that changed nothing: compiled once.
    const { changed } = await this.db.shaped('snapshot extended', { turn, id }, (q, a) =>
      q
        .updateTable('snapshots')
        .set({ through_turn_seq: a.turn })
        .where('id', '=', a.id)
        .where('deleted_at', 'is', null),
    )
    return changed === 1n
  }

  /** Automatic snapshots beyond the newest `keep` of a session, oldest first. */
  async expiredAuto(sessionId: string, keep: number): Promise<SnapshotInfo[]> {
    const rows = await this.live(sessionId)
      .where('kind', '=', 'auto')
      .orderBy('created_at', 'desc')
      .orderBy(sql`rowid`, 'desc')
      .execute()
    return rows.slice(keep).map((row) => toInfo(row as SnapshotRow))
  }

  /** Records a computed content digest (a snapshot is read-only, so it never changes). */
  async setDigest(id: string, digest: string): Promise<void> {
    await this.db.q
      .updateTable('snapshots')
      .set({ digest })
      .where('id', '=', id)
      .where('digest', 'is', null)
      .execute()
  }

  async markDeleted(id: string, at: string): Promise<void> {
    await this.db.q.updateTable('snapshots').set({ deleted_at: at }).where('id', '=', id).execute()
  }

  async allLive(): Promise<{ id: string; session_id: string }[]> {
    return this.db.q
      .selectFrom('snapshots')
      .select(['id', 'session_id'])
      .where('deleted_at', 'is', null)
      .execute()
  }
}

/**
 * Whether a row of `snapshots` stands for the state after `turn`: taken then, or taken after an
 * earlier turn and extended through this one (the turns between changed nothing).
 */
export function standingFor(turn: RawBuilder<unknown>): RawBuilder<boolean> {
  return sql<boolean>`(snapshots.turn_seq = ${turn} or (snapshots.turn_seq < ${turn} and snapshots.through_turn_seq >= ${turn}))`
}
