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
  constructor(private readonly db: Db) {
    this.statements = prepareTurnStatements(db)
  }

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

  /**
   * The newest snapshot that follows `turn` (automatic before-turn ones preferred), including one
   * taken after an earlier turn that stands for this one too (the turns between changed nothing).
   */
  atTurn(sessionId: string, turn: number): SnapshotInfo | undefined {
    const row = this.statements.atTurn.get({ sessionId, turn })
    return row ? toInfo(row) : undefined
  }

  /**
   * Records that the snapshot is also the state after `turn` (the turns since it was taken changed
   * nothing). False when the snapshot is gone (pruned or deleted): take a new one.
   */
  extendThrough(id: string, turn: number): boolean {
    return this.statements.extendThrough.run({ id, turn }).changes === 1
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

  // Statements on the warm path of every turn, prepared once.
  private readonly statements: ReturnType<typeof prepareTurnStatements>
}

function prepareTurnStatements(db: Db) {
  return {
    atTurn: db.prepare<{ sessionId: string; turn: number }, SnapshotRow>(
      `SELECT * FROM snapshots WHERE session_id = @sessionId AND deleted_at IS NULL
         AND (turn_seq = @turn OR (turn_seq < @turn AND through_turn_seq >= @turn))
       ORDER BY (reason = 'before_turn') DESC, turn_seq DESC, created_at DESC, rowid DESC LIMIT 1`,
    ),
    extendThrough: db.prepare<{ id: string; turn: number }>(
      `UPDATE snapshots SET through_turn_seq = @turn WHERE id = @id AND deleted_at IS NULL`,
    ),
  }
}
