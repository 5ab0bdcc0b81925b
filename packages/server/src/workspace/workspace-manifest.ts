import { resolvePersistPaths, type SessionManifest } from '@cairn/protocol'
import { policyOf } from '../sessions/policy.js'
import type { SnapshotStore } from '../snapshots/snapshot-store.js'
import { gitCheckout, lastTests, setupVersion } from './provenance.js'
import type { SnapshotMeasures } from './snapshot-measures.js'
import type { SnapshotPolicy } from './snapshot-policy.js'
import type { WorkspaceServiceDeps } from './workspace-deps.js'
import type { WorkspaceFiles } from './workspace-files.js'

/** A session's manifest: what it runs, on what, and the state of its workspace. */
export class WorkspaceManifest {
  constructor(
    private readonly deps: WorkspaceServiceDeps,
    private readonly snapshots: SnapshotStore,
    private readonly policy: SnapshotPolicy,
    private readonly files: WorkspaceFiles,
    private readonly measures: SnapshotMeasures,
  ) {}

  private async sessionSetup(sessionId: string) {
    const setup = await this.deps.setupOf?.(sessionId)
    if (!setup) return null
    const { status, attempts, exitCode, snapshotId, command } = setup
    return { status, attempts, exitCode, snapshotId, command }
  }

  private async memoryVersion(agentId: string): Promise<number> {
    const row = await this.deps.db.q
      .selectFrom('agent_memory')
      .select((eb) => eb.fn.max<number | null>('version').as('version'))
      .where('agent_id', '=', agentId)
      .executeTakeFirst()
    return Number(row?.version ?? 0)
  }

  /** `withSizes` measures the live workspace too (a walk of its extents without btrfs quotas). */
  /** Typed by the wire schema: a field the schema lacks would be dropped from the answer, so it fails to compile. */
  async build(tenantId: string, id: string, withSizes = false): Promise<SessionManifest> {
    const session = await this.deps.sessions.get(tenantId, id)
    const row = await this.deps.sessions.requireOwned(tenantId, id)
    const revision = await this.deps.agents.store.revision(row.revision_id)
    const turns = await this.deps.sessions.store.turns(id)
    const last = turns[turns.length - 1]
    const present = await this.deps.runtime.hasWorkspace(id)
    const dirty = present ? await this.files.diff(tenantId, id) : undefined
    const sessionSetup = await this.sessionSetup(id)
    const snapshotIds = (await this.snapshots.list(id)).map((s) => s.id)
    const read = present
      ? await this.deps.sessions.readingWorkspace(tenantId, id, async () => ({
          repo: await gitCheckout(this.deps.runtime, id),
          lastTests: await lastTests(this.deps.runtime, id),
        }))
      : { repo: null, lastTests: null }
    const workspaceSizes =
      withSizes && present
        ? await this.deps.sessions.readingWorkspace(tenantId, id, () =>
            this.measures.measure({ sessionId: id }),
          )
        : null
    return {
      session,
      agent: { id: row.agent_id, name: row.agent_name },
      revision: {
        id: row.revision_id,
        contentHash: revision?.contentHash ?? null,
        envKey: revision?.envKey ?? null,
        command: revision?.command ?? [],
        protocol: revision?.protocol ?? 'stdio',
      },
      baseImage: await this.deps.agents.images.describe(revision?.manifest.imageKey),
      driver: revision?.manifest.isolation ?? this.deps.runtimeDrivers.isolation,
      storage: this.deps.runtimeDrivers.storage,
      setupVersion: setupVersion(revision?.manifest.setup, sessionSetup?.command),
      sessionSetup,
      generation: row.generation,
      parentSessionId: row.parent_session_id,
      forkedFromSnapshotId: row.forked_from_snapshot_id,
      snapshotIds,
      snapshotId: snapshotIds.at(-1) ?? null,
      memoryVersion: await this.memoryVersion(row.agent_id),
      ...read,
      workspaceSizes,
      lastTurn: last
        ? {
            id: last.id,
            turn: last.seq,
            status: last.status,
            durationMs: last.durationMs,
            endedAt: last.endedAt,
          }
        : null,
      dirtyFiles: dirty
        ? { added: dirty.added, changed: dirty.changed, deleted: dirty.deleted, truncated: dirty.truncated }
        : null,
      persist: resolvePersistPaths(revision?.manifest.persist),
      limits: revision?.manifest.limits ?? {},
      // Services listening inside the running sandbox, reachable as previews (…/ports/{port}/).
      openPorts: await this.deps.runtime.listeningPorts(id),
      policies: {
        ...policyOf(row),
        deadlineAt: row.deadline_at,
        keepAutoSnapshots: await this.policy.keepAuto(tenantId),
      },
    }
  }
}
