import { newId, type Usage } from '@cairn/protocol'
import type { RuntimePort, TreeRef, TreeSizes } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import type { SessionService } from '../sessions/session-service.js'
import type { SessionRow } from '../sessions/session-store.js'
import type { WorkspaceService } from '../workspace/workspace-service.js'

export interface RetentionPolicy {
  /** Automatic snapshots kept per session (newest first); manual ones are kept until deleted. */
  keepAutoSnapshots: number
  /** Snapshots of ended sessions (completed, failed, timeout) are deleted this long after the end. */
  endedSnapshotTtlMs: number | null
  /** Workspaces of ended sessions are deleted this long after the end (the session becomes deleted). */
  endedWorkspaceTtlMs: number | null
}

export const DEFAULT_RETENTION: RetentionPolicy = {
  keepAutoSnapshots: 50,
  endedSnapshotTtlMs: null,
  endedWorkspaceTtlMs: null,
}

interface EndedRow {
  id: string
  tenant_id: string
  status: 'completed' | 'failed' | 'timeout'
  updated_at: string
}

/** Per-tenant retention: applies the policy, records what was deleted and the bytes freed. */
export class RetentionService {
  constructor(
    private readonly deps: {
      db: Db
      /** The runtime, only through its port. */
      runtime: RuntimePort
      sessions: SessionService
      workspace: WorkspaceService
      clock: Clock
      logger: Logger
      /**
       * A paused session's memory checkpoint is deleted this long after it was taken (the session
       * starts cold next time, and says why); null keeps them until the session's sandbox goes.
       */
      memoryCheckpointTtlMs?: number | null | undefined
    },
  ) {}

  policy(tenantId: string): RetentionPolicy {
    const row = this.deps.db
      .prepare<
        [string],
        {
          keep_auto_snapshots: number
          ended_snapshot_ttl_ms: number | null
          ended_workspace_ttl_ms: number | null
        }
      >('SELECT * FROM retention_policies WHERE tenant_id = ?')
      .get(tenantId)
    if (!row) return { ...DEFAULT_RETENTION }
    return {
      keepAutoSnapshots: row.keep_auto_snapshots,
      endedSnapshotTtlMs: row.ended_snapshot_ttl_ms,
      endedWorkspaceTtlMs: row.ended_workspace_ttl_ms,
    }
  }

  setPolicy(tenantId: string, patch: Partial<RetentionPolicy>): RetentionPolicy {
    const next = { ...this.policy(tenantId), ...patch }
    this.deps.db
      .prepare(
        `INSERT INTO retention_policies (tenant_id, keep_auto_snapshots, ended_snapshot_ttl_ms, ended_workspace_ttl_ms, updated_at)
         VALUES (?, ?, ?, ?, ?)
         ON CONFLICT(tenant_id) DO UPDATE SET keep_auto_snapshots = excluded.keep_auto_snapshots,
           ended_snapshot_ttl_ms = excluded.ended_snapshot_ttl_ms, ended_workspace_ttl_ms = excluded.ended_workspace_ttl_ms,
           updated_at = excluded.updated_at`,
      )
      .run(
        tenantId,
        next.keepAutoSnapshots,
        next.endedSnapshotTtlMs,
        next.endedWorkspaceTtlMs,
        iso(this.deps.clock.now()),
      )
    return next
  }

  private record(
    tenantId: string,
    sessionId: string,
    kind: string,
    targetId: string,
    bytes: number,
    reason: string,
  ): void {
    this.deps.db
      .prepare(
        'INSERT INTO retention_events (id, tenant_id, session_id, kind, target_id, bytes_freed, reason, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
      )
      .run(newId('event'), tenantId, sessionId, kind, targetId, bytes, reason, iso(this.deps.clock.now()))
  }

  /**
   * Bytes only this subvolume references, measured before it is deleted. Data shared with the
   * revision, a fork or another snapshot is not counted (it is not freed by this deletion alone).
   */
  private async exclusiveBytes(tree: TreeRef): Promise<number> {
    return (await this.deps.runtime.treeSizes(tree).catch(() => ({ exclusiveBytes: 0 }))).exclusiveBytes
  }

  /** Applies every tenant's policy once. Returns what it deleted. */
  async apply(): Promise<{
    snapshots: number
    workspaces: number
    memoryCheckpoints: number
    bytesFreed: number
  }> {
    const now = this.deps.clock.now()
    const ended = this.deps.db
      .prepare<[], EndedRow>(
        `SELECT id, tenant_id, status, updated_at FROM sessions WHERE status IN ('completed', 'failed', 'timeout')`,
      )
      .all()
    const result = { snapshots: 0, workspaces: 0, memoryCheckpoints: 0, bytesFreed: 0 }
    const policies = new Map<string, RetentionPolicy>()
    for (const session of ended) {
      const policy = policies.get(session.tenant_id) ?? this.policy(session.tenant_id)
      policies.set(session.tenant_id, policy)
      const endedFor = now - Date.parse(session.updated_at)
      if (policy.endedWorkspaceTtlMs !== null && endedFor >= policy.endedWorkspaceTtlMs) {
        for (const snap of this.deps.workspace.snapshots.list(session.id)) {
          const bytes = await this.exclusiveBytes({ snapshotId: snap.id })
          this.record(session.tenant_id, session.id, 'snapshot', snap.id, bytes, 'ended_workspace_ttl')
          result.bytesFreed += bytes
          result.snapshots++
        }
        const bytes = await this.exclusiveBytes({ sessionId: session.id })
        await this.deps.sessions.delete(session.tenant_id, session.id, 'retention')
        this.record(session.tenant_id, session.id, 'workspace', session.id, bytes, 'ended_workspace_ttl')
        result.bytesFreed += bytes
        result.workspaces++
        continue
      }
      if (policy.endedSnapshotTtlMs !== null && endedFor >= policy.endedSnapshotTtlMs) {
        for (const snap of this.deps.workspace.snapshots.list(session.id)) {
          if (this.deps.workspace.pins.has(snap.id)) continue
          // Marked first, in the same tick as the pin check, so no restore or fork picks it now.
          this.deps.workspace.snapshots.markDeleted(snap.id, iso(now))
          const bytes = await this.exclusiveBytes({ snapshotId: snap.id })
          await this.deps.runtime.deleteSnapshot(snap.id)
          this.record(session.tenant_id, session.id, 'snapshot', snap.id, bytes, 'ended_snapshot_ttl')
          result.bytesFreed += bytes
          result.snapshots++
        }
      }
    }
    await this.expireMemoryCheckpoints(now, result)
    if (result.snapshots + result.workspaces + result.memoryCheckpoints > 0)
      this.deps.logger.info(result, 'retention applied')
    return result
  }

  /** Ages out memory checkpoints past `memoryCheckpointTtlMs`, recorded for the tenant and the session. */
  private async expireMemoryCheckpoints(
    now: number,
    result: { memoryCheckpoints: number; bytesFreed: number },
  ): Promise<void> {
    const ttlMs = this.deps.memoryCheckpointTtlMs
    if (ttlMs === null || ttlMs === undefined) return
    const { store } = this.deps.sessions
    for (const { sessionId, bytes } of await this.deps.runtime.expireMemoryCheckpoints(
      new Date(now - ttlMs),
    )) {
      const row = this.deps.db
        .prepare<[string], { tenant_id: string; status: string }>(
          'SELECT tenant_id, status FROM sessions WHERE id = ?',
        )
        .get(sessionId)
      if (!row) continue
      this.record(row.tenant_id, sessionId, 'memory_checkpoint', sessionId, bytes, 'memory_checkpoint_ttl')
      store.note(
        { id: sessionId, status: row.status as SessionRow['status'] },
        'memory_discarded',
        iso(this.deps.clock.now()),
        `memory checkpoint discarded by retention: taken more than ${ttlMs} ms ago (memoryCheckpointTtlMs)`,
      )
      result.memoryCheckpoints++
      result.bytesFreed += bytes
    }
  }

  freed(tenantId: string): { bytesFreed: number; deletedSnapshots: number; deletedWorkspaces: number } {
    const row = this.deps.db
      .prepare<[string], { bytes: number | null; snapshots: number; workspaces: number }>(
        `SELECT SUM(bytes_freed) AS bytes, SUM(kind = 'snapshot') AS snapshots, SUM(kind = 'workspace') AS workspaces
         FROM retention_events WHERE tenant_id = ?`,
      )
      .get(tenantId)
    return {
      bytesFreed: row?.bytes ?? 0,
      deletedSnapshots: row?.snapshots ?? 0,
      deletedWorkspaces: row?.workspaces ?? 0,
    }
  }

  /** Typed by the wire schema: a field the schema lacks would be dropped from the answer, so it fails to compile. */
  async usage(tenantId: string, withStorage: boolean): Promise<Usage> {
    const byStatus = Object.fromEntries(
      this.deps.db
        .prepare<[string], { status: string; n: number }>(
          'SELECT status, COUNT(*) AS n FROM sessions WHERE tenant_id = ? GROUP BY status',
        )
        .all(tenantId)
        .map((r) => [r.status, r.n]),
    ) as Record<string, number>
    const snapshots =
      this.deps.db
        .prepare<[string], { n: number }>(
          'SELECT COUNT(*) AS n FROM snapshots WHERE tenant_id = ? AND deleted_at IS NULL',
        )
        .get(tenantId)?.n ?? 0
    const storage: { sessionId: string; referencedBytes: number; exclusiveBytes: number }[] = []
    if (withStorage) {
      const recent = this.deps.db
        .prepare<[string], { id: string }>(
          `SELECT id FROM sessions WHERE tenant_id = ? AND status != 'deleted' ORDER BY last_active_at DESC LIMIT 100`,
        )
        .all(tenantId)
      for (const { id } of recent) {
        const sizes = await this.deps.runtime
          .treeSizes({ sessionId: id })
          // A workspace removed since the query (or unreadable) is left out of the usage report.
          .catch((error: unknown) => {
            this.deps.logger.debug({ err: error, session: id }, 'no storage usage for a session')
            return undefined
          })
        if (sizes) storage.push({ sessionId: id, ...sizes })
      }
    }
    const { runtime } = this.deps
    const live = this.deps.db
      .prepare<[string], { id: string }>(
        `SELECT id FROM sessions WHERE tenant_id = ? AND status != 'deleted'`,
      )
      .all(tenantId)
    const checkpointBytes = (await runtime.memoryCheckpointBytes(live.map((r) => r.id))).filter((b) => b > 0)
    const { warning: _warning, ...limits } = runtime.quotaStatus()
    const held = (await runtime.tenantUsage([tenantId]).catch(() => ({}) as Record<string, TreeSizes>))[
      tenantId
    ]
    return {
      sessions: { total: Object.values(byStatus).reduce((a, b) => a + b, 0), byStatus },
      snapshots,
      pool: await runtime.poolStats(),
      // What this tenant's workspaces, snapshots and revisions hold against its quota (exclusive bytes).
      quota: {
        enforced: limits.enforced,
        ...(limits.workspaceBytes === undefined ? {} : { workspaceBytes: limits.workspaceBytes }),
        ...(limits.tenantBytes === undefined ? {} : { tenantBytes: limits.tenantBytes }),
        ...(limits.reserveBytes === undefined ? {} : { reserveBytes: limits.reserveBytes }),
        ...(limits.agentsTotalBytes === undefined ? {} : { agentsTotalBytes: limits.agentsTotalBytes }),
        usedBytes: held?.exclusiveBytes ?? null,
      },
      retention: { policy: this.policy(tenantId), ...this.freed(tenantId) },
      memoryCheckpoints: { count: checkpointBytes.length, bytes: checkpointBytes.reduce((a, b) => a + b, 0) },
      storage,
    }
  }
}
