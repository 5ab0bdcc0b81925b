import type { Readable } from 'node:stream'
import { CairnProblem, type FileEntry, isPersistPath, PERSIST_DIR, type WorkspaceDiff } from '@cairn/protocol'
import type { TreeReadOptions as ReadOptions, TreeRef } from '@cairn/runtime/port'
import { workspaceRelative } from '../files/confine.js'
import type { SessionRow } from '../sessions/session-store.js'
import type { SnapshotStore } from '../snapshots/snapshot-store.js'
import type { HeavyReads } from './heavy-reads.js'
import type { SnapshotPolicy } from './snapshot-policy.js'
import { WALK, type WorkspaceServiceDeps } from './workspace-deps.js'

/**
 * The files of a session's workspace and of its snapshots: list, download, upload, delete, and the
 * diff against the revision or a snapshot.
 */
export class WorkspaceFiles {
  constructor(
    private readonly deps: WorkspaceServiceDeps,
    private readonly snapshots: SnapshotStore,
    private readonly policy: SnapshotPolicy,
    private readonly heavyReads: HeavyReads,
  ) {}

  /** A session's workspace, or one of its snapshots, as a tree of the runtime. */
  async root(tenantId: string, id: string, snapshotId?: string): Promise<TreeRef> {
    return this.rootOf(await this.deps.sessions.requireLive(tenantId, id), snapshotId)
  }

  /** `root` for a session already read (and found not deleted). */
  async rootOf(row: SessionRow, snapshotId?: string): Promise<TreeRef> {
    const { id } = row
    if (snapshotId) {
      if (!(await this.snapshots.get(id, snapshotId)))
        throw new CairnProblem('not_found', `No snapshot ${snapshotId} in session ${id}`)
      return { snapshotId }
    }
    if (!(await this.deps.runtime.hasWorkspace(id)))
      throw await this.deps.sessions.missingWorkspace(row.tenant_id, id)
    return { sessionId: id }
  }

  /** Runs a read of a workspace or of a snapshot (which no restore or deletion moves). */
  private async reading<T>(
    tenantId: string,
    id: string,
    snapshotId: string | undefined,
    read: () => Promise<T>,
    walk = false,
  ): Promise<T> {
    if (!snapshotId) return this.deps.sessions.readingWorkspace(tenantId, id, read, walk)
    return read().catch((error: NodeJS.ErrnoException) => {
      if (error.code === 'ENOENT') throw new CairnProblem('not_found', 'no such file in the snapshot')
      throw error
    })
  }

  /**
   * Lists a directory of the workspace or a snapshot. `rel` is the path's bytes (see
   * `requestedPath`); the walk to it follows no link at any component.
   */
  async listFiles(
    tenantId: string,
    id: string,
    rel: Buffer,
    snapshotId?: string,
    options: ReadOptions = {},
  ): Promise<FileEntry[]> {
    const root = await this.root(tenantId, id, snapshotId)
    return this.reading(tenantId, id, snapshotId, () => this.deps.runtime.listFiles(root, rel, options), WALK)
  }

  /**
   * A regular file of the workspace or a snapshot, opened for streaming (see `openTreeFile`): a
   * heavy read of the tenant's until the stream closes (a 500 GB sparse file streams zeros for as
   * long as the client reads), its reader under nice.
   */
  async openFile(tenantId: string, id: string, rel: Buffer, snapshotId?: string, options: ReadOptions = {}) {
    const root = await this.root(tenantId, id, snapshotId)
    if (rel.length === 0) throw new CairnProblem('validation_failed', '/workspace is not a regular file')
    const release = this.heavyReads.acquire(tenantId, 'a download')
    try {
      const file = await this.reading(tenantId, id, snapshotId, () =>
        this.deps.runtime.openFile(root, rel, { ...options, background: true }),
      )
      file.stream.once('close', release)
      const slash = rel.lastIndexOf(0x2f)
      return { ...file, name: rel.subarray(slash + 1).toString('utf8') }
    } catch (error) {
      release()
      throw error
    }
  }

  async writeFile(tenantId: string, id: string, rawPath: string, body: Readable): Promise<void> {
    const rel = writablePath(rawPath)
    await this.root(tenantId, id)
    await this.deps.sessions.changingWorkspace(id, async () => {
      await this.policy.settled(id)
      this.policy.changed(id)
      await this.deps.runtime.writeFile(id, rel, body)
      await this.deps.sessions.advanceGeneration(id)
    })
    await this.deps.sessions.touch(id)
  }

  async deleteFile(tenantId: string, id: string, rawPath: string): Promise<void> {
    const rel = writablePath(rawPath)
    await this.root(tenantId, id)
    await this.deps.sessions.changingWorkspace(id, async () => {
      await this.policy.settled(id)
      this.policy.changed(id)
      await this.deps.runtime.deletePath(id, rel)
      // At a full quota the marker (an xattr) cannot be written even though the delete went
      // through (with simple quotas, data a snapshot still holds keeps counting): the generation
      // stays, as after a turn that ends at a full quota, and the delete is answered as done.
      await this.deps.sessions.advanceGeneration(id).catch((error: unknown) => {
        if (!(error instanceof CairnProblem && error.code === 'quota_exceeded')) throw error
        this.deps.logger.warn({ sessionId: id }, 'the workspace generation stays: its quota is full')
      })
    })
    await this.deps.sessions.touch(id)
  }

  /**
   * Files added, changed and deleted since the revision (`from` absent or `revision`) or a
   * snapshot. Two walks of whole trees: a heavy read of the tenant's (`rate_limited` beyond its
   * slots), under nice.
   */
  async diff(tenantId: string, id: string, from?: string, options: ReadOptions = {}): Promise<WorkspaceDiff> {
    const row = await this.deps.sessions.requireLive(tenantId, id)
    const root = await this.rootOf(row)
    const walk = { ...options, background: true }
    if (!from || from === 'revision')
      return this.heavyReads.run(tenantId, 'a diff', () =>
        this.deps.sessions.readingWorkspace(
          tenantId,
          id,
          () => this.deps.runtime.diff({ revisionId: row.revision_id }, root, row.revision_id, walk),
          WALK,
        ),
      )
    if (!(await this.snapshots.get(id, from)))
      throw new CairnProblem('not_found', `No snapshot ${from} in session ${id}`)
    return this.heavyReads.run(tenantId, 'a diff', () =>
      this.deps.sessions.readingWorkspace(
        tenantId,
        id,
        () => this.deps.runtime.diff({ snapshotId: from }, root, from, walk),
        WALK,
      ),
    )
  }
}

/**
 * A path the files API may write or delete: not the persisted paths' store (`.cairn-persist`),
 * which only the agent writes, at the paths it declared (read it, export it, restore a snapshot).
 */
function writablePath(rawPath: string): string {
  const rel = workspaceRelative(rawPath)
  if (isPersistPath(rel))
    throw new CairnProblem(
      'validation_failed',
      `${PERSIST_DIR}/ holds the agent's persisted paths: the files API reads it but does not write it`,
      { path: rel },
    )
  return rel
}
