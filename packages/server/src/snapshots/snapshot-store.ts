import type { SnapshotInfo, SnapshotReason } from '@cairn/protocol'
import type { Db } from '../db/database.js'

interface SnapshotRow {
  id: string
  session_id: string
  tenant_id: string
  kind: 'auto' | 'manual'
  reason: SnapshotReason
  label: string | null
  turn_seq: number
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
    generation: row.generation,
    digest: row.digest ?? null,
    sizes: null,
    createdAt: row.created_at,
  }
}

/** Snapshot records; the subvolumes themselves live in the pool's `snapshots` area. */
export class SnapshotStore {
  constructor(private readonly db: Db) {}

  insertWithId(id: string, row: Omit<SnapshotRow, 'id'>): SnapshotInfo {
    const full = { id, ...row }
    this.db
      .prepare(
        `INSERT INTO snapshots (id, session_id, tenant_id, kind, reason, label, turn_seq, generation, created_at)
         VALUES (@id, @session_id, @tenant_id, @kind, @reason, @label, @turn_seq, @generation, @created_at)`,
      )
      .run(full)
    return toInfo(full)
  }

  get(sessionId: string, id: string): SnapshotInfo | undefined {
    const row = this.db
      .prepare<[string, string], SnapshotRow>(
        'SELECT * FROM snapshots WHERE session_id = ? AND id = ? AND deleted_at IS NULL',
      )
      .get(sessionId, id)
    return row ? toInfo(row) : undefined
  }

  list(sessionId: string): SnapshotInfo[] {
    return this.db
      .prepare<[string], SnapshotRow>(
        'SELECT * FROM snapshots WHERE session_id = ? AND deleted_at IS NULL ORDER BY created_at, rowid',
      )
      .all(sessionId)
      .map(toInfo)
  }

  /** The newest snapshot that follows `turn` (automatic before-turn ones preferred). */
  atTurn(sessionId: string, turn: number): SnapshotInfo | undefined {
    const row = this.db
      .prepare<[string, number], SnapshotRow>(
        `SELECT * FROM snapshots WHERE session_id = ? AND turn_seq = ? AND deleted_at IS NULL
         ORDER BY (reason = 'before_turn') DESC, created_at DESC, rowid DESC LIMIT 1`,
      )
      .get(sessionId, turn)
    return row ? toInfo(row) : undefined
  }

  /** Automatic snapshots beyond the newest `keep` of a session, oldest first. */
  expiredAuto(sessionId: string, keep: number): SnapshotInfo[] {
    return this.db
      .prepare<[string, number], SnapshotRow>(
        `SELECT * FROM snapshots WHERE session_id = ? AND kind = 'auto' AND deleted_at IS NULL
         ORDER BY created_at DESC, rowid DESC LIMIT -1 OFFSET ?`,
      )
      .all(sessionId, keep)
      .map(toInfo)
  }

  /** Records a computed content digest (a snapshot is read-only, so it never changes). */
  setDigest(id: string, digest: string): void {
    this.db.prepare('UPDATE snapshots SET digest = ? WHERE id = ? AND digest IS NULL').run(digest, id)
  }

  markDeleted(id: string, at: string): void {
    this.db.prepare('UPDATE snapshots SET deleted_at = ? WHERE id = ?').run(at, id)
  }

  allLive(): { id: string; session_id: string }[] {
    return this.db
      .prepare<[], { id: string; session_id: string }>(
        'SELECT id, session_id FROM snapshots WHERE deleted_at IS NULL',
      )
      .all()
  }
}
