import { spawn } from 'node:child_process'
import { chmod } from 'node:fs/promises'
import type { Readable } from 'node:stream'
import { newId, type SessionInfo, type SnapshotInfo } from '@cairn/protocol'
import { DEFAULT_ARCHIVE_LIMITS, inspectArchive } from '../agents/archive.js'
import { iso } from '../clock.js'
import { BACKGROUND_NICENESS } from '../files/reader.js'
import { unpackIntoWorkspace } from '../files/sandboxed-io.js'
import type { SnapshotPins } from '../snapshots/snapshot-pins.js'
import type { HeavyReads } from './heavy-reads.js'
import type { SnapshotPolicy } from './snapshot-policy.js'
import { SWAPS_WORKSPACE, type WorkspaceServiceDeps } from './workspace-deps.js'
import type { WorkspaceFiles } from './workspace-files.js'

/** An export's stream is cut (its tar killed) after this long. */
export const EXPORT_TIMEOUT_MS = 30 * 60_000

/** A workspace as a tar.gz: export (of the live workspace or a snapshot) and import. */
export class WorkspaceArchive {
  constructor(
    private readonly deps: WorkspaceServiceDeps,
    private readonly pins: SnapshotPins,
    private readonly policy: SnapshotPolicy,
    private readonly files: WorkspaceFiles,
    private readonly heavyReads: HeavyReads,
  ) {}

  private now(): string {
    return iso(this.deps.clock.now())
  }

  /**
   * A consistent tar.gz of the workspace (taken from a temporary snapshot) or of a snapshot, made
   * by GNU tar in a child process (its own process group, killed by `cleanup` or after
   * EXPORT_TIMEOUT_MS). A snapshot is read-only, so nothing can be swapped in while tar reads it,
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
    const { pool } = this.deps.runtime
    const releaseSlot = this.heavyReads.acquire(tenantId, 'an export')
    let dir: string
    let releaseTree = async () => undefined
    try {
      if (snapshotId) {
        dir = await this.files.rootOf(row, snapshotId)
        // Pinned until the stream is done, as for a restore: retention prunes it on a later pass.
        let unpin = () => {}
        void this.pins.hold(snapshotId, () => new Promise<void>((resolve) => (unpin = resolve)))
        releaseTree = async () => void unpin()
      } else {
        await this.files.rootOf(row)
        const temp = newId('snapshot')
        await this.deps.sessions.readingWorkspace(tenantId, id, () => this.policy.frozenSnapshot(row, temp))
        dir = pool.snapshotPath(temp)
        releaseTree = async () => {
          // The export is sent; a temporary snapshot left behind only takes space, so it is reported.
          await pool
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
    // Not portable: modes and names are kept exactly (a read-only directory stays read-only
    // through export and import).
    // Under nice (inherited by the gzip tar starts): an export yields the CPU to the sessions' turns.
    const child = spawn(
      'nice',
      [
        '-n',
        String(BACKGROUND_NICENESS),
        'tar',
        '--create',
        '--gzip',
        '--format=gnu',
        '--sparse',
        '--sort=name',
        '--numeric-owner',
        // What the agent marked setuid or setgid must not become such a program where the archive
        // is unpacked (as an import drops the bits): the archive records every mode without them,
        // and without the sticky bit (GNU tar's --mode cannot tell files from directories, so a
        // sticky directory loses it too; on a file it means nothing).
        '--mode=ug-s,-t',
        '--one-file-system',
        '--directory',
        dir,
        '--file',
        '-',
        '.',
      ],
      { stdio: ['ignore', 'pipe', 'pipe'], detached: true, env: { PATH: '/usr/bin:/bin', LC_ALL: 'C' } },
    )
    child.stderr.resume()
    const exited = new Promise<void>((resolve) => {
      child.once('close', () => resolve())
      child.once('error', () => resolve())
    })
    const killGroup = () => {
      if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) {
        try {
          process.kill(-child.pid, 'SIGKILL')
        } catch {
          // already gone
        }
      }
    }
    const timer = setTimeout(killGroup, EXPORT_TIMEOUT_MS)
    timer.unref()
    let cleaned: Promise<void> | undefined
    const cleanup = () => {
      cleaned ??= (async () => {
        clearTimeout(timer)
        killGroup()
        await exited
        await releaseTree()
        releaseSlot()
      })()
      return cleaned
    }
    return { stream: child.stdout, cleanup }
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
        const { pool } = this.deps.runtime
        const before = await this.deps.manualSnapshotCap.within(row, () =>
          this.policy.take(row, 'manual', 'before_import', row.turn_count),
        )
        this.policy.changed(id)
        await this.deps.sessions.stopSandbox(id)
        const { store } = this.deps.sessions
        if (mode === 'replace') {
          const staging = await pool.createWorkspaceStaging(
            `imp_${id.slice(id.indexOf('_') + 1)}`,
            row.tenant_id,
          )
          // The imported tree is a new generation: its marker is set before it is swapped in,
          // the database follows.
          const generation = (await store.generationOf(id)) + 1
          try {
            await unpackIntoWorkspace(this.deps.runtime, staging, archive)
            await chmod(staging, 0o700)
            await pool.replaceWorkspace(id, staging, generation)
          } catch (error) {
            // The upload's error is the one to answer; a staging tree left behind is logged.
            await pool
              .discardStaging(staging)
              .catch((e: unknown) =>
                this.deps.logger.warn({ err: e, staging }, 'discarding an upload staging tree failed'),
              )
            throw error
          }
          await store.setGeneration(id, generation)
        } else {
          try {
            await unpackIntoWorkspace(this.deps.runtime, pool.workspacePath(id), archive)
            await chmod(pool.workspacePath(id), 0o700)
          } catch (error) {
            // Rolled back to the snapshot, as a restore would: a new generation, marker first.
            const generation = (await store.generationOf(id)) + 1
            await pool.restoreWorkspace(id, before.id, generation, row.tenant_id)
            await store.setGeneration(id, generation)
            throw error
          }
          await this.deps.sessions.advanceGeneration(id)
        }
        await this.deps.sessions.store.transition(
          row,
          row.status,
          'workspace_imported',
          this.now(),
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
