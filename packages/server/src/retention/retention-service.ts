import { newId, type Usage } from '@cairn/protocol'
import type { RuntimePort, TreeRef, TreeSizes } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { BuildLogs } from '../agents/build-logs.js'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import type { Schema } from '../db/schema.js'
import type { ImageService } from '../images/image-service.js'
import { artifactUsage, commandLogUsage, keptBeside } from '../limits/storage-budget.js'
import type { ArtifactStore } from '../memory/artifact-store.js'
import type { SessionRow } from '../sessions/session-rows.js'
import type { SessionService } from '../sessions/session-service.js'
import type { WorkspaceService } from '../workspace/workspace-service.js'
import { DEFAULT_LAYER_TTLS, type LayerCounts, LayerRetention, type LayerTtls } from './layers.js'

export interface RetentionPolicy extends LayerTtls {
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
  ...DEFAULT_LAYER_TTLS,
}

/** The policy's columns in `retention_policies`, by field. */
const COLUMNS = {
  keepAutoSnapshots: 'keep_auto_snapshots',
  endedSnapshotTtlMs: 'ended_snapshot_ttl_ms',
  endedWorkspaceTtlMs: 'ended_workspace_ttl_ms',
  artifactTtlMs: 'artifact_ttl_ms',
  buildLogTtlMs: 'build_log_ttl_ms',
  setupLogTtlMs: 'setup_log_ttl_ms',
  memoryVersionTtlMs: 'memory_version_ttl_ms',
  networkLogTtlMs: 'network_log_ttl_ms',
  sessionEventTtlMs: 'session_event_ttl_ms',
  turnEventTtlMs: 'turn_event_ttl_ms',
} as const satisfies Record<keyof RetentionPolicy, keyof Schema['retention_policies']>

interface EndedRow {
  id: string
  tenant_id: string
  status: 'completed' | 'failed' | 'timeout'
  updated_at: string
}

/** Sessions whose automatic snapshots are pruned at a time by a retention pass. */
const PRUNE_BATCH = 100

/** Per-tenant retention: applies the policy, records what was deleted and the bytes freed. */
export class RetentionService {
  /**
   * Per tenant, the policy (its `updated_at` and N) every session in this process's care was last
   * pruned to (keep-last-N); a tenant is pruned again when its policy changes. Empty until the
   * first pass, which prunes every tenant's sessions (after a start, or a new cluster leader).
   */
  private readonly pruned = new Map<string, string>()
  private prunedOnce = false
  private readonly layers: LayerRetention

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
      /** The distinct images the tenant's revisions run on, against its allowance. */
      images?: Pick<ImageService, 'tenantImages'> | undefined
      /** Deletes artifacts past `artifactTtlMs`. */
      artifacts?: Pick<ArtifactStore, 'delete'> | undefined
      /** Removes build log files past `buildLogTtlMs`. */
      buildLogs?: Pick<BuildLogs, 'forget'> | undefined
    },
  ) {
    const { store } = deps.sessions
    this.layers = new LayerRetention({
      db: deps.db,
      logger: deps.logger,
      artifacts: deps.artifacts,
      buildLogs: deps.buildLogs,
      runtimeId: () => (store.everySession ? undefined : store.runtimeId),
      record: (...args) => this.record(...args),
    })
  }

  async policy(tenantId: string): Promise<RetentionPolicy> {
    const row = await this.deps.db.q
      .selectFrom('retention_policies')
      .selectAll()
      .where('tenant_id', '=', tenantId)
      .executeTakeFirst()
    if (!row) return { ...DEFAULT_RETENTION }
    const policy = { ...DEFAULT_RETENTION }
    for (const [field, column] of Object.entries(COLUMNS)) {
      const value = row[column]
      // PostgreSQL hands 64-bit integers back as they were stored; null is "keep".
      Object.assign(policy, { [field]: value === null ? null : Number(value) })
    }
    return policy
  }

  async setPolicy(tenantId: string, patch: Partial<RetentionPolicy>): Promise<RetentionPolicy> {
    const next = { ...(await this.policy(tenantId)), ...patch }
    const values = {
      ...(Object.fromEntries(
        Object.entries(COLUMNS).map(([field, column]) => [column, next[field as keyof RetentionPolicy]]),
      ) as Omit<Schema['retention_policies'], 'tenant_id' | 'updated_at'>),
      updated_at: iso(this.deps.clock.now()),
    }
    await this.deps.db.q
      .insertInto('retention_policies')
      .values({ tenant_id: tenantId, ...values })
      .onConflict((oc) => oc.column('tenant_id').doUpdateSet(values))
      .execute()
    return next
  }

  private async record(
    tenantId: string,
    sessionId: string,
    kind: string,
    targetId: string,
    bytes: number,
    reason: string,
  ): Promise<void> {
    await this.deps.db.q
      .insertInto('retention_events')
      .values({
        id: newId('event'),
        tenant_id: tenantId,
        session_id: sessionId,
        kind,
        target_id: targetId,
        bytes_freed: bytes,
        reason,
        at: iso(this.deps.clock.now()),
      })
      .execute()
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
    /** The other layers (artifacts, logs, memory versions, events, secrets): rows and bytes. */
    layers: LayerCounts
  }> {
    const now = this.deps.clock.now()
    const ended = (await this.deps.db.q
      .selectFrom('sessions')
      .select(['id', 'tenant_id', 'status', 'updated_at'])
      // Each replica applies the policy to the sessions of its own runtime (an API replica's
      // leader: to every node's).
      .$if(!this.deps.sessions.store.everySession, (q) =>
        q.where('runtime_id', '=', this.deps.sessions.store.runtimeId),
      )
      .where('status', 'in', ['completed', 'failed', 'timeout'])
      .execute()) as EndedRow[]
    const result = { snapshots: 0, workspaces: 0, memoryCheckpoints: 0, bytesFreed: 0 }
    const policies = new Map<string, RetentionPolicy>()
    for (const session of ended) {
      const policy = policies.get(session.tenant_id) ?? (await this.policy(session.tenant_id))
      policies.set(session.tenant_id, policy)
      const endedFor = now - Date.parse(session.updated_at)
      if (policy.endedWorkspaceTtlMs !== null && endedFor >= policy.endedWorkspaceTtlMs) {
        for (const snap of await this.deps.workspace.snapshots.list(session.id)) {
          const bytes = await this.exclusiveBytes({ snapshotId: snap.id })
          await this.record(session.tenant_id, session.id, 'snapshot', snap.id, bytes, 'ended_workspace_ttl')
          result.bytesFreed += bytes
          result.snapshots++
        }
        const bytes = await this.exclusiveBytes({ sessionId: session.id })
        await this.deps.sessions.delete(session.tenant_id, session.id, 'retention')
        await this.record(
          session.tenant_id,
          session.id,
          'workspace',
          session.id,
          bytes,
          'ended_workspace_ttl',
        )
        result.bytesFreed += bytes
        result.workspaces++
        continue
      }
      if (policy.endedSnapshotTtlMs !== null && endedFor >= policy.endedSnapshotTtlMs) {
        for (const snap of await this.deps.workspace.snapshots.list(session.id)) {
          // Claimed first, in the same tick as the pin check, so no restore or fork picks it now.
          if (!this.deps.workspace.pins.claimForDeletion(snap.id)) continue
          await this.deps.workspace.snapshots.markDeleted(snap.id, iso(now))
          const bytes = await this.exclusiveBytes({ snapshotId: snap.id })
          await this.deps.runtime.deleteSnapshot(snap.id)
          await this.record(session.tenant_id, session.id, 'snapshot', snap.id, bytes, 'ended_snapshot_ttl')
          result.bytesFreed += bytes
          result.snapshots++
        }
      }
    }
    await this.pruneAutoSnapshots(result)
    await this.expireMemoryCheckpoints(now, result)
    const layers: LayerCounts = {}
    await this.applyLayers(now, layers)
    for (const layer of Object.values(layers)) result.bytesFreed += layer.bytesFreed
    if (result.snapshots + result.workspaces + result.memoryCheckpoints + Object.keys(layers).length > 0)
      this.deps.logger.info({ ...result, layers }, 'retention applied')
    return { ...result, layers }
  }

  /** Every tenant's layer TTLs (the defaults where it set none), then expired secrets. */
  private async applyLayers(nowMs: number, layers: LayerCounts): Promise<void> {
    for (const { id } of await this.deps.db.q.selectFrom('tenants').select('id').execute())
      await this.layers.apply(id, await this.policy(id), nowMs, layers)
    await this.layers
      .expireSecrets(nowMs, layers)
      .catch((error: unknown) => this.deps.logger.warn({ err: error }, 'deleting expired secrets failed'))
  }

  /**
   * Keep-last-N applied to every session, not only at a session's next turn: a tenant whose
   * `keepAutoSnapshots` changed since this process last pruned it (every tenant, at the first
   * pass) has its sessions with more automatic snapshots than that pruned, a batch of sessions
   * at a time. A tenant is done once none was left over (a snapshot being read is pruned on the
   * next pass).
   */
  private async pruneAutoSnapshots(result: { snapshots: number; bytesFreed: number }): Promise<void> {
    const { db } = this.deps
    const policies = await db.q
      .selectFrom('retention_policies')
      .select(['tenant_id', 'keep_auto_snapshots', 'updated_at'])
      .execute()
    const stamps = new Map(policies.map((p) => [p.tenant_id, `${p.updated_at} ${p.keep_auto_snapshots}`]))
    const tenants = this.prunedOnce
      ? policies
          .filter((p) => this.pruned.get(p.tenant_id) !== stamps.get(p.tenant_id))
          .map((p) => p.tenant_id)
      : (await db.q.selectFrom('tenants').select('id').execute()).map((t) => t.id)
    for (const tenantId of tenants) {
      const keep = (await this.policy(tenantId)).keepAutoSnapshots
      if (await this.pruneTenant(tenantId, keep, result))
        this.pruned.set(tenantId, stamps.get(tenantId) ?? '')
    }
    this.prunedOnce = true
  }

  /** Prunes the tenant's sessions with more than `keep` automatic snapshots; true: none is left over. */
  private async pruneTenant(
    tenantId: string,
    keep: number,
    result: { snapshots: number; bytesFreed: number },
  ): Promise<boolean> {
    const { store } = this.deps.sessions
    let complete = true
    let after = ''
    for (;;) {
      const over = await this.deps.db.q
        .selectFrom('snapshots as sn')
        .innerJoin('sessions as s', 's.id', 'sn.session_id')
        .select('sn.session_id as id')
        .where('sn.tenant_id', '=', tenantId)
        .where('sn.kind', '=', 'auto')
        .where('sn.deleted_at', 'is', null)
        .where('s.status', '!=', 'deleted')
        .$if(!store.everySession, (q) => q.where('s.runtime_id', '=', store.runtimeId))
        .where('sn.session_id', '>', after)
        .groupBy('sn.session_id')
        .having((eb) => eb.fn.countAll(), '>', keep)
        .orderBy('sn.session_id')
        .limit(PRUNE_BATCH)
        .execute()
      for (const { id } of over) {
        const done = await this.deps.workspace.policy
          .pruneAuto(id, tenantId, async (snap) => {
            const bytes = await this.exclusiveBytes({ snapshotId: snap.id })
            await this.record(tenantId, id, 'snapshot', snap.id, bytes, 'keep_auto_snapshots')
            result.bytesFreed += bytes
            result.snapshots++
          })
          .catch((error: unknown) => {
            this.deps.logger.warn({ err: error, session: id }, 'pruning automatic snapshots failed')
            return { deleted: 0, pinned: 1 }
          })
        if (done.pinned > 0) complete = false
      }
      const last = over.at(-1)
      if (!last || over.length < PRUNE_BATCH) return complete
      after = last.id
    }
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
      const row = await this.deps.db.q
        .selectFrom('sessions')
        .select(['tenant_id', 'status'])
        .where('id', '=', sessionId)
        .executeTakeFirst()
      if (!row) continue
      await this.record(
        row.tenant_id,
        sessionId,
        'memory_checkpoint',
        sessionId,
        bytes,
        'memory_checkpoint_ttl',
      )
      await store.note(
        { id: sessionId, status: row.status as SessionRow['status'] },
        'memory_discarded',
        iso(this.deps.clock.now()),
        `memory checkpoint discarded by retention: taken more than ${ttlMs} ms ago (memoryCheckpointTtlMs)`,
      )
      result.memoryCheckpoints++
      result.bytesFreed += bytes
    }
  }

  async freed(tenantId: string): Promise<{
    bytesFreed: number
    deletedSnapshots: number
    deletedWorkspaces: number
    layers: LayerCounts
  }> {
    const rows = await this.deps.db.q
      .selectFrom('retention_events')
      .select((eb) => [
        'kind',
        eb.fn.sum<number | null>('bytes_freed').as('bytes'),
        eb.fn.countAll<number>().as('events'),
      ])
      .where('tenant_id', '=', tenantId)
      .groupBy('kind')
      .execute()
    const layers: LayerCounts = {}
    for (const row of rows)
      layers[row.kind] = { deleted: Number(row.events), bytesFreed: Number(row.bytes ?? 0) }
    return {
      bytesFreed: rows.reduce((sum, row) => sum + Number(row.bytes ?? 0), 0),
      deletedSnapshots: layers.snapshot?.deleted ?? 0,
      deletedWorkspaces: layers.workspace?.deleted ?? 0,
      layers,
    }
  }

  /** Typed by the wire schema: a field the schema lacks would be dropped from the answer, so it fails to compile. */
  async usage(tenantId: string, withStorage: boolean): Promise<Usage> {
    const byStatus = Object.fromEntries(
      (
        await this.deps.db.q
          .selectFrom('sessions')
          .select((eb) => ['status', eb.fn.countAll<number>().as('n')])
          .where('tenant_id', '=', tenantId)
          .groupBy('status')
          .execute()
      ).map((r) => [r.status, Number(r.n)]),
    ) as Record<string, number>
    const snapshots = Number(
      (
        await this.deps.db.q
          .selectFrom('snapshots')
          .select((eb) => eb.fn.countAll<number>().as('n'))
          .where('tenant_id', '=', tenantId)
          .where('deleted_at', 'is', null)
          .executeTakeFirst()
      )?.n ?? 0,
    )
    const storage: { sessionId: string; referencedBytes: number; exclusiveBytes: number }[] = []
    if (withStorage) {
      const recent = await this.deps.db.q
        .selectFrom('sessions')
        .select('id')
        .where('tenant_id', '=', tenantId)
        .where('status', '!=', 'deleted')
        .orderBy('last_active_at', 'desc')
        .limit(100)
        .execute()
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
    const live = await this.deps.db.q
      .selectFrom('sessions')
      .select('id')
      .where('tenant_id', '=', tenantId)
      .where('status', '!=', 'deleted')
      .execute()
    const checkpointBytes = (await runtime.memoryCheckpointBytes(live.map((r) => r.id))).filter((b) => b > 0)
    const { warning: _warning, ...limits } = await runtime.quotaStatus()
    const kept = await keptBeside(this.deps.db, tenantId)
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
      retention: { policy: await this.policy(tenantId), ...(await this.freed(tenantId)) },
      memoryCheckpoints: { count: checkpointBytes.length, bytes: checkpointBytes.reduce((a, b) => a + b, 0) },
      // Bytes as the budget's check counts them: the tenant's counters, not a sum of its rows.
      artifacts: await artifactUsage(this.deps.db, tenantId, this.deps.clock.now(), kept),
      commandLogs: await commandLogUsage(this.deps.db, tenantId, kept),
      ...(this.deps.images ? { images: await this.deps.images.tenantImages(tenantId) } : {}),
      storage,
    }
  }
}
