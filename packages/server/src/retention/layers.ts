import { CairnProblem } from '@cairn/protocol'
import { sql } from 'kysely'
import type { Logger } from 'pino'
import type { BuildLogs } from '../agents/build-logs.js'
import { iso } from '../clock.js'
import type { Db } from '../db/database.js'
import type { ArtifactStore } from '../memory/artifact-store.js'

/** The layers beside workspaces and snapshots, each with its TTL (ms; null keeps). */
export interface LayerTtls {
  artifactTtlMs: number | null
  buildLogTtlMs: number | null
  setupLogTtlMs: number | null
  memoryVersionTtlMs: number | null
  networkLogTtlMs: number | null
  sessionEventTtlMs: number | null
  turnEventTtlMs: number | null
}

/**
 * The defaults (the table in docs/retention.md states them): every layer is kept, but a turn's
 * stored stream events, which only serve to resume a dropped stream, go a day after the turn.
 */
export const DEFAULT_LAYER_TTLS: LayerTtls = {
  artifactTtlMs: null,
  buildLogTtlMs: null,
  setupLogTtlMs: null,
  memoryVersionTtlMs: null,
  networkLogTtlMs: null,
  sessionEventTtlMs: null,
  turnEventTtlMs: 24 * 60 * 60 * 1000,
}

/** What one pass deleted, per layer (`retention_events.kind`): rows and bytes. */
export type LayerCounts = Record<string, { deleted: number; bytesFreed: number }>

/** Items of a row-by-row layer (artifacts, logs) one pass deletes at most per tenant. */
const LAYER_BATCH = 500

/**
 * What a delete freed: the rows it deleted, and their share of the bytes counted before it (another
 * process applying the same TTL may have deleted some first); undefined when it deleted none.
 */
function freedBy(
  result: { numDeletedRows: bigint },
  counted: { n: number | string; bytes: number | string | null },
): [number, number] | undefined {
  const deleted = Number(result.numDeletedRows)
  const n = Number(counted.n)
  if (deleted === 0 || n === 0) return undefined
  return [deleted, Math.round((Number(counted.bytes ?? 0) * Math.min(deleted, n)) / n)]
}

/** Records one deletion: the tenant, its owner (session, or agent for agent-level layers), what, bytes. */
export type RecordDeletion = (
  tenantId: string,
  ownerId: string,
  kind: string,
  targetId: string,
  bytes: number,
  reason: string,
) => Promise<void>

/**
 * Retention of the layers beside workspaces and snapshots: artifacts, build and setup logs,
 * memory versions, network logs, status and turn events, and expired secrets. Each pass deletes
 * what is older than the tenant's TTL now, so a changed setting reaches existing data at the next
 * pass. Session-level layers are applied to the sessions this process reaps (its runtime's, or
 * every node's for a cluster's leader), agent-level ones to the tenant's agents.
 */
export class LayerRetention {
  constructor(
    private readonly deps: {
      db: Db
      logger: Logger
      /** Deletes an artifact's row and bytes (as `DELETE /v1/agents/{id}/artifacts/{artifactId}`). */
      artifacts?: Pick<ArtifactStore, 'delete'> | undefined
      /** Removes a build log's file from the data dir once its stored copy is emptied. */
      buildLogs?: Pick<BuildLogs, 'forget'> | undefined
      /** The runtime whose sessions this process reaps; undefined: every session (a cluster's leader). */
      runtimeId: () => string | undefined
      record: RecordDeletion
    },
  ) {}

  /** Applies `ttls` to the tenant's layers as of `nowMs`, adding what it deleted to `counts`. */
  async apply(tenantId: string, ttls: LayerTtls, nowMs: number, counts: LayerCounts): Promise<void> {
    const cutoff = (ttlMs: number | null) => (ttlMs === null ? undefined : iso(nowMs - ttlMs))
    const steps: [string, string | undefined, (at: string) => Promise<void>][] = [
      ['artifact', cutoff(ttls.artifactTtlMs), (at) => this.artifacts(tenantId, at, counts)],
      ['build_log', cutoff(ttls.buildLogTtlMs), (at) => this.buildLogs(tenantId, at, counts)],
      ['setup_log', cutoff(ttls.setupLogTtlMs), (at) => this.setupLogs(tenantId, at, counts)],
      ['memory_version', cutoff(ttls.memoryVersionTtlMs), (at) => this.memory(tenantId, at, counts)],
      ['network_log', cutoff(ttls.networkLogTtlMs), (at) => this.networkLog(tenantId, at, counts)],
      ['session_event', cutoff(ttls.sessionEventTtlMs), (at) => this.sessionEvents(tenantId, at, counts)],
      ['turn_event', cutoff(ttls.turnEventTtlMs), (at) => this.turnEvents(tenantId, at, counts)],
    ]
    for (const [layer, at, step] of steps) {
      if (at === undefined) continue
      // One layer failing leaves the others to this pass, and itself to the next.
      await step(at).catch((error: unknown) =>
        this.deps.logger.warn({ err: error, tenant: tenantId, layer }, 'retention of a layer failed'),
      )
    }
  }

  /** Records what was deleted (`owner`: a session, or an agent for agent-level layers) and counts it. */
  private async note(
    counts: LayerCounts,
    tenantId: string,
    kind: string,
    [ownerId, targetId]: [string, string],
    [deleted, bytes]: [number, number],
  ): Promise<void> {
    const reason = kind === 'secret' ? 'secret_expiry' : `${kind}_ttl`
    await this.deps.record(tenantId, ownerId, kind, targetId, bytes, reason)
    const layer = counts[kind] ?? { deleted: 0, bytesFreed: 0 }
    counts[kind] = { deleted: layer.deleted + deleted, bytesFreed: layer.bytesFreed + bytes }
  }

  /** Sessions of the tenant this process reaps. */
  private sessionsOf(tenantId: string) {
    const runtimeId = this.deps.runtimeId()
    return this.deps.db.q
      .selectFrom('sessions')
      .select('sessions.id')
      .where('sessions.tenant_id', '=', tenantId)
      .$if(runtimeId !== undefined, (q) => q.where('sessions.runtime_id', '=', runtimeId as string))
  }

  private async artifacts(tenantId: string, before: string, counts: LayerCounts): Promise<void> {
    const store = this.deps.artifacts
    if (!store) return
    const rows = await this.deps.db.q
      .selectFrom('artifacts')
      .select(['id', 'agent_id', 'session_id', 'size_bytes'])
      .where('tenant_id', '=', tenantId)
      .where('created_at', '<=', before)
      .limit(LAYER_BATCH)
      .execute()
    for (const row of rows) {
      const gone = await store.delete(row.agent_id, row.id).then(
        () => true,
        (error: unknown) => {
          // Deleted through the API meanwhile: not this pass's to count.
          if (error instanceof CairnProblem && error.code === 'not_found') return false
          throw error
        },
      )
      if (!gone) continue
      await this.note(counts, tenantId, 'artifact', [row.session_id, row.id], [1, row.size_bytes])
    }
  }

  /** Empties stored build logs (the revision and its status stay); an agent's current revision keeps its log. */
  private async buildLogs(tenantId: string, before: string, counts: LayerCounts): Promise<void> {
    const { db } = this.deps
    const rows = await db.q
      .selectFrom('build_logs')
      .innerJoin('revisions', 'revisions.id', 'build_logs.revision_id')
      .select(['build_logs.revision_id as id', 'build_logs.log', 'revisions.agent_id'])
      .where('revisions.tenant_id', '=', tenantId)
      .where('revisions.created_at', '<=', before)
      .where('build_logs.log', '!=', '')
      .where('build_logs.revision_id', 'not in', (eb) =>
        eb.selectFrom('agents').select('current_revision_id').where('current_revision_id', 'is not', null),
      )
      .limit(LAYER_BATCH)
      .execute()
    for (const row of rows) {
      await db.q.updateTable('build_logs').set({ log: '' }).where('revision_id', '=', row.id).execute()
      await this.deps.buildLogs?.forget(row.id)
      const bytes = Buffer.byteLength(row.log)
      await this.note(counts, tenantId, 'build_log', [row.agent_id, row.id], [1, bytes])
    }
  }

  /** Empties ended setup and resume logs; each phase's status, exit code and error stay. */
  private async setupLogs(tenantId: string, before: string, counts: LayerCounts): Promise<void> {
    for (const table of ['session_setups', 'session_resume_runs'] as const) {
      const { db } = this.deps
      const rows = await db.q
        .selectFrom(table)
        .select(['session_id', 'log'])
        .where('session_id', 'in', this.sessionsOf(tenantId))
        .where('status', '!=', 'running')
        .where('ended_at', '<=', before)
        .where('log', '!=', '')
        .limit(LAYER_BATCH)
        .execute()
      for (const row of rows) {
        await db.q
          .updateTable(table)
          .set({ log: '' })
          .where('session_id', '=', row.session_id)
          .where('status', '!=', 'running')
          .execute()
        const bytes = Buffer.byteLength(row.log)
        await this.note(counts, tenantId, 'setup_log', [row.session_id, row.session_id], [1, bytes])
      }
    }
  }

  /** Deletes an agent memory's past versions; the current one (the highest version) always stays. */
  private async memory(tenantId: string, before: string, counts: LayerCounts): Promise<void> {
    const { db } = this.deps
    const agents = db.q.selectFrom('agents').select('id').where('tenant_id', '=', tenantId)
    const past = await db.q
      .selectFrom('agent_memory as m')
      .select((eb) => [
        'm.agent_id',
        eb.fn.countAll<number>().as('n'),
        eb.fn.sum<number | null>(sql`length(m.content)`).as('bytes'),
      ])
      .where('m.agent_id', 'in', agents)
      .where('m.created_at', '<=', before)
      .where(
        sql<boolean>`m.version < (SELECT max(c.version) FROM agent_memory c WHERE c.agent_id = m.agent_id)`,
      )
      .groupBy('m.agent_id')
      .execute()
    for (const row of past) {
      const gone = await db.q
        .deleteFrom('agent_memory')
        .where('agent_id', '=', row.agent_id)
        .where('created_at', '<=', before)
        .where(
          sql<boolean>`version < (SELECT max(c.version) FROM agent_memory c WHERE c.agent_id = ${row.agent_id})`,
        )
        .executeTakeFirst()
      const freed = freedBy(gone, row)
      if (freed) await this.note(counts, tenantId, 'memory_version', [row.agent_id, row.agent_id], freed)
    }
  }

  /** Deletes network log entries, counted per session (bytes: the stored text's length). */
  private async networkLog(tenantId: string, before: string, counts: LayerCounts): Promise<void> {
    await this.perSession(tenantId, counts, 'network_log', {
      table: 'network_events',
      before,
      bytes: sql`length(host) + length(method) + length(reason) + coalesce(length(address), 0) + length(at) + 16`,
    })
  }

  /**
   * Deletes status events; each session's latest stays (the cause of the status it is in). The
   * transcript (GET …/messages) is read from the turns, which no TTL here deletes.
   */
  private async sessionEvents(tenantId: string, before: string, counts: LayerCounts): Promise<void> {
    await this.perSession(tenantId, counts, 'session_event', {
      table: 'session_events',
      before,
      bytes: sql`length(id) + length(to_status) + length(cause) + coalesce(length(detail), 0) + length(at)`,
      keep: sql`at < (SELECT max(l.at) FROM session_events l WHERE l.session_id = session_events.session_id)`,
    })
  }

  private async perSession(
    tenantId: string,
    counts: LayerCounts,
    kind: string,
    layer: {
      table: 'network_events' | 'session_events'
      before: string
      bytes: ReturnType<typeof sql>
      keep?: ReturnType<typeof sql> | undefined
    },
  ): Promise<void> {
    const { db } = this.deps
    const rows = await db.q
      .selectFrom(layer.table)
      .select((eb) => [
        'session_id',
        eb.fn.countAll<number>().as('n'),
        eb.fn.sum<number | null>(layer.bytes).as('bytes'),
      ])
      .where('session_id', 'in', this.sessionsOf(tenantId))
      .where('at', '<=', layer.before)
      .$if(layer.keep !== undefined, (q) => q.where(layer.keep as ReturnType<typeof sql<boolean>>))
      .groupBy('session_id')
      .execute()
    for (const row of rows) {
      const gone = await db.q
        .deleteFrom(layer.table)
        .where('session_id', '=', row.session_id)
        .where('at', '<=', layer.before)
        .$if(layer.keep !== undefined, (q) => q.where(layer.keep as ReturnType<typeof sql<boolean>>))
        .executeTakeFirst()
      const freed = freedBy(gone, row)
      if (freed) await this.note(counts, tenantId, kind, [row.session_id, row.session_id], freed)
    }
  }

  /** Deletes the stored stream events of turns that ended before the cutoff (a batch of turns a pass). */
  private async turnEvents(tenantId: string, before: string, counts: LayerCounts): Promise<void> {
    const { db } = this.deps
    const turns = await db.q
      .selectFrom('turn_events')
      .innerJoin('turns', 'turns.id', 'turn_events.turn_id')
      .select((eb) => [
        'turn_events.turn_id',
        'turns.session_id',
        eb.fn.countAll<number>().as('n'),
        eb.fn.sum<number | null>(sql`length(turn_events.event)`).as('bytes'),
      ])
      .where('turns.session_id', 'in', this.sessionsOf(tenantId))
      .where('turns.ended_at', '<=', before)
      .groupBy(['turn_events.turn_id', 'turns.session_id'])
      .limit(LAYER_BATCH)
      .execute()
    for (const turn of turns) {
      const gone = await db.q.deleteFrom('turn_events').where('turn_id', '=', turn.turn_id).executeTakeFirst()
      const freed = freedBy(gone, turn)
      if (freed) await this.note(counts, tenantId, 'turn_event', [turn.session_id, turn.turn_id], freed)
    }
  }

  /** Deletes every secret past its expiry (they are no longer injected from that moment on). */
  async expireSecrets(nowMs: number, counts: LayerCounts): Promise<void> {
    const { db } = this.deps
    const expired = await db.q
      .selectFrom('secrets')
      .select(['tenant_id', 'agent_id', 'name', 'ciphertext'])
      .where('expires_at', 'is not', null)
      .where('expires_at', '<=', iso(nowMs))
      .limit(LAYER_BATCH)
      .execute()
    for (const row of expired) {
      const gone = await db.q
        .deleteFrom('secrets')
        .where('agent_id', '=', row.agent_id)
        .where('name', '=', row.name)
        .where('expires_at', '<=', iso(nowMs))
        .executeTakeFirst()
      if (Number(gone.numDeletedRows) === 0) continue
      const target: [string, string] = [row.agent_id, `${row.agent_id}/${row.name}`]
      await this.note(counts, row.tenant_id, 'secret', target, [1, row.ciphertext.length])
    }
  }
}
