import type { Readable } from 'node:stream'
import { newId, type SessionInfo, type SnapshotInfo } from '@cairn/protocol'
import type { TreeRef } from '@cairn/runtime/port'
import { DEFAULT_ARCHIVE_LIMITS, inspectArchive } from '../agents/archive.js'
import type { SnapshotPins } from '../snapshots/snapshot-pins.js'
import type { HeavyReads } from './heavy-reads.js'
import type { SnapshotPolicy } from './snapshot-policy.js'
import { rollBack, SWAPS_WORKSPACE, type WorkspaceServiceDeps } from './workspace-deps.js'
import type { WorkspaceFiles } from './workspace-files.js'

/** A workspace as a tar.gz: export (of the live workspace or a snapshot) and import. */
export class WorkspaceArchive {
  constructor(
    private readonly deps: WorkspaceServiceDeps,
    private readonly pins: SnapshotPins,
    private readonly policy: SnapshotPolicy,
    private readonly files: WorkspaceFiles,
    private readonly heavyReads: HeavyReads,
  ) {}

  /**
   * A consistent tar.gz of the workspace (taken from a temporary snapshot) or of a snapshot, made
   * by GNU tar in a child process (its own process group, killed by `cleanup` or after
   * the runtime's export timeout). A snapshot is read-only, so nothing can be swapped in while tar reads it,
   * and tar never follows a link. The GNU format carries names as raw bytes, records FIFOs and
   * devices without opening them (sockets are left out), and `--sparse` seeks over holes. Counts
   * against the tenant's heavy reads until `cleanup`.
   */
  async export(
    tenantId: string,
    id: string,
    snapshotId?: string,
  ): Promise<{ stream: Readable; cleanup: () => Promise<void> }> {
    const row = await this.deps.sessions.requireLive(tenantId, id)
    const releaseSlot = this.heavyReads.acquire(tenantId, 'an export')
    let tree: TreeRef
    let releaseTree = async () => undefined
    try {
      if (snapshotId) {
        tree = await this.files.rootOf(row, snapshotId)
        // Pinned until the stream is done, as for a restore: retention prunes it on a later pass.
        let unpin = () => {}
        void this.pins.hold(snapshotId, () => new Promise<void>((resolve) => (unpin = resolve)))
        releaseTree = async () => void unpin()
      } else {
        await this.files.rootOf(row)
        const temp = newId('snapshot')
        await this.deps.sessions.readingWorkspace(tenantId, id, () => this.policy.frozenSnapshot(row, temp))
        tree = { snapshotId: temp }
        releaseTree = async () => {
          // The export is sent; a temporary snapshot left behind only takes space, so it is reported.
          await this.deps.runtime
            .deleteSnapshot(temp)
            .catch((e: unknown) =>
              this.deps.logger.warn({ err: e, snapshot: temp }, 'removing an export snapshot failed'),
            )
        }
      }
    } catch (error) {
      releaseSlot()
      throw error
    }
    const tar = await this.deps.runtime.exportTree(tree)
    let cleaned: Promise<void> | undefined
    const cleanup = () => {
      cleaned ??= (async () => {
        await tar.stop()
        await releaseTree()
        releaseSlot()
      })()
      return cleaned
    }
    return { stream: tar.stream, cleanup }
  }

  /**
   * Replaces the workspace with a tar.gz (or, with `merge`, unpacks it over the workspace). The
   * archive gets the same checks as a deploy before anything is touched; a snapshot is taken
   * first so the import can be undone, and a merge that fails half-way is rolled back to it.
   */
  async import(
    tenantId: string,
    id: string,
    archive: Buffer,
    mode: 'replace' | 'merge' = 'replace',
  ): Promise<{ session: SessionInfo; snapshot: SnapshotInfo; fileCount: number; sizeBytes: number }> {
    await this.files.root(tenantId, id)
    const summary = await inspectArchive(archive, this.deps.archiveLimits ?? DEFAULT_ARCHIVE_LIMITS)
    await this.policy.settled(id)
    return this.deps.sessions.exclusive(
      tenantId,
      id,
      'an import',
      async (row) => {
        const before = await this.deps.manualSnapshotCap.within(row, (snapshotId) =>
          this.policy.take(row, 'manual', 'before_import', row.turn_count, undefined, snapshotId),
        )
        this.policy.changed(id)
        await this.deps.sessions.stopSandbox(id)
        const { store } = this.deps.sessions
        if (mode === 'replace') {
          // The imported tree is a new generation: its marker is set before it is swapped in,
          // the database follows.
          const generation = (await store.generationOf(id)) + 1
          try {
            await this.deps.runtime.replaceWorkspaceWithArchive(id, row.tenant_id, archive, generation)
          } catch (error) {
            // The workspace is as it was: its undo snapshot, the same tree, would only stay
            // counted toward the manual snapshot cap (and the quota) unless one reads it meanwhile.
            await this.policy.dropUnlessPinned(id, before, "a failed import's snapshot")
            throw error
          }
          await this.deps.sessions.setGeneration(id, generation)
        } else {
          try {
            await this.deps.runtime.unpackIntoWorkspace(id, archive)
          } catch (error) {
            throw await rollBack(this.deps, row, before, error)
          }
          await this.deps.sessions.advanceGeneration(id)
        }
        await this.deps.sessions.recordWorkspaceEvent(
          row,
          'workspace_imported',
          `${mode}: ${summary.fileCount} entries, ${summary.sizeBytes} bytes (undo: restore ${before.id})`,
        )
        return {
          session: await this.deps.sessions.get(tenantId, id),
          snapshot: before,
          fileCount: summary.fileCount,
          sizeBytes: summary.sizeBytes,
        }
      },
      SWAPS_WORKSPACE,
    )
  }
}
