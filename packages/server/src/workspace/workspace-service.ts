import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { chmod } from 'node:fs/promises'

import type { Readable } from 'node:stream'
import {
  CairnProblem,
  type FileEntry,
  type ForkBody,
  newId,
  type RestoreBody,
  type SessionInfo,
  type SessionManifest,
  type SetupInfo,
  type SnapshotInfo,
  type SnapshotReason,
  type WorkspaceDiff,
} from '@cairn/protocol'
import type { AgentProcess, Runtime } from '@cairn/runtime'
import type { Logger } from 'pino'
import type { AgentService } from '../agents/agent-service.js'
import { type ArchiveLimits, DEFAULT_ARCHIVE_LIMITS, inspectArchive } from '../agents/archive.js'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import { workspaceRelative } from '../files/confine.js'
import { BACKGROUND_NICENESS, openTreeFile, type ReadOptions } from '../files/reader.js'
import { deleteWorkspacePath, unpackIntoWorkspace, writeWorkspaceFile } from '../files/sandboxed-io.js'
import { diffTrees, listDirectory } from '../files/tree.js'
import type { ManualSnapshotCap } from '../limits/snapshot-cap.js'
import { applyPolicy, policyColumns, policyOf } from '../sessions/policy.js'
import type { SessionService } from '../sessions/session-service.js'
import type { InterruptedTurn, SessionRow } from '../sessions/session-store.js'
import { SnapshotPins } from '../snapshots/snapshot-pins.js'
import { SnapshotStore } from '../snapshots/snapshot-store.js'
import { HeavyReads } from './heavy-reads.js'
import { type SnapshotExtras, SnapshotMeasures } from './snapshot-measures.js'

/** An export's stream is cut (its tar killed) after this long. */
export const EXPORT_TIMEOUT_MS = 30 * 60_000

/** Restores and imports swap the live workspace: reads that meet one answer `session_busy`. */
const SWAPS_WORKSPACE = true
/** Listings and diffs walk many entries: one that overlapped a swap answers `session_busy`, not a mix. */
const WALK = true

/** The workspace as of an automatic snapshot, to tell whether a later turn changed it. */
interface SnapshotMark {
  snapshotId: string
  /** The warm sandbox frozen for the snapshot. */
  sandboxId: string
  /** The workspace subvolume's ctransid right after the snapshot. */
  ctransid: number
  /** The sandbox's dirtied-bytes counter at the snapshot. */
  writtenBytes: number
}

export interface WorkspaceServiceDeps {
  db: Db
  runtime: Runtime
  sessions: SessionService
  agents: AgentService
  clock: Clock
  logger: Logger
  /** Limits of an imported archive (the same checks as a deploy). */
  archiveLimits?: ArchiveLimits | undefined
  /** Automatic snapshots kept per session (manual ones are kept until deleted). */
  keepAutoSnapshots?: (tenantId: string) => Promise<number>
  /** The session's setup phase, for the manifest. */
  setupOf?: (sessionId: string) => Promise<SetupInfo | undefined>
  /** How many manual snapshots a session and a tenant may keep. */
  manualSnapshotCap: ManualSnapshotCap
}

/**
 * The session workspace as a versioned object: snapshots (frozen, O(1)), exact restore, fork,
 * files, diff and export. Every mutation holds the session's turn lock.
 */
export class WorkspaceService {
  readonly snapshots: SnapshotStore
  /** Snapshots a restore or a fork is copying from: retention leaves them for its next pass. */
  readonly pins = new SnapshotPins()
  private retention: Promise<void> = Promise.resolve()
  private readonly pending = new Map<string, Promise<void>>()
  /** Sessions whose workspace changed outside a turn since their last snapshot. */
  private readonly dirty = new Set<string>()
  private readonly measures: SnapshotMeasures
  /** Digests and exports running per tenant. */
  private readonly heavyReads = new HeavyReads()
  /** Per session, what its workspace looked like when its newest automatic snapshot was taken. */
  private readonly marks = new Map<string, SnapshotMark>()

  constructor(private readonly deps: WorkspaceServiceDeps) {
    this.snapshots = new SnapshotStore(deps.db)
    this.measures = new SnapshotMeasures(deps.runtime.pool, this.snapshots, this.heavyReads)
    // The snapshot that lets turn N be undone is the state after turn N-1. It is taken as soon as
    // turn N-1 ends (the agent is waiting for input), off the critical path of the reply; turn N
    // waits for it, and takes one itself when something changed the workspace in between.
    deps.sessions.onAfterTurn((row, seq, agent, unchanged) => {
      if (!row.auto_snapshots) return
      this.track(row.id, this.snapshotAfterTurn(row, seq, agent?.alive ? agent : undefined, unchanged))
    })
    deps.sessions.onUnchangedProbe(async (sessionId, agent) => {
      const mark = this.marks.get(sessionId)
      return mark ? this.unchangedSince(sessionId, mark, agent) : false
    })
    // The state before turn 1 is the revision: snapshot it at creation, before any sandbox exists,
    // so the first turn neither waits for it nor freezes a sandbox that is still starting.
    deps.sessions.onCreated((row) => {
      if (!row.auto_snapshots) return
      this.track(row.id, this.take(row, 'auto', 'before_turn', 0))
    })
    deps.sessions.onBeforeTurn(async (row, seq, agent) => {
      if (!row.auto_snapshots) return
      await this.pending.get(row.id)
      if (this.dirty.has(row.id) || !(await this.snapshots.atTurn(row.id, seq - 1))) {
        this.dirty.delete(row.id)
        await this.take(row, 'auto', 'before_turn', seq - 1, agent)
      }
    })
    deps.sessions.onDeleted((sessionId) => {
      this.marks.delete(sessionId)
      return this.deleteAll(sessionId)
    })
  }

  /**
   * The snapshot that makes turn `seq + 1` undoable. When the turn changed nothing in the
   * workspace, the previous automatic snapshot already is that state: it is recorded as standing
   * for this turn too, and no snapshot (a btrfs transaction commit) is taken. `unchanged` is the
   * turn runner's answer from `unchangedSince` (the one that kept the generation), not asked again.
   */
  private async snapshotAfterTurn(
    row: SessionRow,
    seq: number,
    agent: AgentProcess | undefined,
    unchanged: boolean,
  ): Promise<void> {
    // After the reply's stream is ended (the hook runs just after run.completed is written).
    await new Promise((resolve) => setImmediate(resolve))
    const mark = this.marks.get(row.id)
    if (mark && agent && unchanged && (await this.snapshots.extendThrough(mark.snapshotId, seq))) return
    await this.take(row, 'auto', 'before_turn', seq, agent)
  }

  /**
   * Whether the workspace is exactly as it was when `mark` was taken: nothing written through the
   * API, the same sandbox still running (a sandbox that stopped in between could have written and
   * gone), no page of file data dirtied by its processes (buffered writes reach btrfs's trees only
   * when flushed), and no inode of the workspace updated (the subvolume's ctransid). Any doubt
   * answers no.
   */
  private async unchangedSince(sessionId: string, mark: SnapshotMark, agent: AgentProcess): Promise<boolean> {
    if (this.dirty.has(sessionId) || mark.sandboxId !== agent.sandboxId || !agent.alive) return false
    const written = agent.writtenBytes()
    if (written === undefined || written !== mark.writtenBytes) return false
    const ctransid = await this.deps.runtime.pool.workspaceMark(sessionId)
    return ctransid !== undefined && ctransid === mark.ctransid && !this.dirty.has(sessionId)
  }

  /**
   * The automatic snapshot after a successful setup phase. The workspace counts as changed, so the
   * first turn's pre-turn snapshot is the set-up workspace and undoing turn 1 keeps the setup.
   */
  async snapshotAfterSetup(row: SessionRow): Promise<SnapshotInfo> {
    await this.pending.get(row.id)
    const info = await this.take(row, 'auto', 'after_setup', 0)
    if (row.auto_snapshots) this.dirty.add(row.id)
    return info
  }

  private async sessionSetup(sessionId: string) {
    const setup = await this.deps.setupOf?.(sessionId)
    if (!setup) return null
    const { status, attempts, exitCode, snapshotId, command } = setup
    return { status, attempts, exitCode, snapshotId, command }
  }

  /** Remembers a background snapshot so the next operation on the session waits for it. */
  private track(sessionId: string, work: Promise<unknown>): void {
    const pending = work
      .then(() => undefined)
      .catch((error) =>
        this.deps.logger.warn({ err: error, session: sessionId }, 'background snapshot failed'),
      )
    this.pending.set(sessionId, pending)
    void pending.finally(() => {
      if (this.pending.get(sessionId) === pending) this.pending.delete(sessionId)
    })
  }

  private now(): string {
    return iso(this.deps.clock.now())
  }

  /** Takes a snapshot with the sandbox (if warm) frozen, then applies keep-last-N to automatic ones. */
  private async take(
    row: SessionRow,
    kind: 'auto' | 'manual',
    reason: SnapshotReason,
    turnSeq: number,
    agent?: AgentProcess,
    label?: string,
  ): Promise<SnapshotInfo> {
    const snapshotId = newId('snapshot')
    const seen = await this.frozenSnapshot(row, snapshotId, agent)
    const current = await this.deps.sessions.store.get(row.tenant_id, row.id)
    const info = await this.snapshots.insertWithId(snapshotId, {
      session_id: row.id,
      tenant_id: row.tenant_id,
      kind,
      reason,
      label: label ?? null,
      turn_seq: turnSeq,
      generation: current?.generation ?? row.generation,
      created_at: this.now(),
    })
    if (kind === 'auto') {
      if (seen) this.marks.set(row.id, { snapshotId, ...seen })
      else this.marks.delete(row.id)
    }
    // Pruning old automatic snapshots is off the turn's critical path, serialised per service.
    if (kind === 'auto')
      this.retention = this.retention
        .then(() => this.applyRetention(row.id, row.tenant_id))
        // Pruning is retried after the next auto snapshot; a failure only keeps snapshots longer.
        .catch((error: unknown) =>
          this.deps.logger.warn({ err: error, session: row.id }, 'snapshot pruning failed'),
        )
    return info
  }

  /**
   * A read-only snapshot of the workspace with the session's warm sandbox (if any) frozen. Returns
   * what the workspace and its sandbox looked like at that instant (for `unchangedSince`), when
   * both could be read.
   */
  private async frozenSnapshot(
    row: Pick<SessionRow, 'id' | 'tenant_id'>,
    snapshotId: string,
    agent?: AgentProcess,
  ): Promise<Omit<SnapshotMark, 'snapshotId'> | undefined> {
    const sessionId = row.id
    const warm = agent ?? this.deps.sessions.warmAgent(sessionId)
    await warm?.freeze()
    try {
      const ctransid = await this.deps.runtime.pool.snapshotWorkspace(sessionId, snapshotId, row.tenant_id)
      // Read while still frozen: nothing the sandbox writes from here on is in the snapshot.
      const writtenBytes = warm?.writtenBytes()
      if (!warm || ctransid === undefined || writtenBytes === undefined) return undefined
      return { sandboxId: warm.sandboxId, ctransid, writtenBytes }
    } finally {
      await warm?.thaw()
    }
  }

  private async applyRetention(sessionId: string, tenantId: string): Promise<void> {
    const keep = (await this.deps.keepAutoSnapshots?.(tenantId)) ?? 50
    for (const old of await this.snapshots.expiredAuto(sessionId, keep)) {
      if (!this.pins.claimForDeletion(old.id)) continue
      // Claimed first (in the same tick as the pin check): a restore or fork can no longer pick it.
      // Should the removal fail, start-up's reconcile removes the unrecorded subvolume.
      await this.snapshots.markDeleted(old.id, this.now())
      await this.deps.runtime.pool.deleteSnapshot(old.id)
    }
  }

  async snapshot(tenantId: string, id: string, label?: string): Promise<SnapshotInfo> {
    await this.pending.get(id)
    return this.deps.sessions.exclusive(tenantId, id, 'a snapshot', (row) =>
      this.deps.manualSnapshotCap.within(row, () =>
        this.take(row, 'manual', 'manual', row.turn_count, undefined, label),
      ),
    )
  }

  /**
   * A session's snapshots; `digest` computes each missing content digest, `sizes` measures each
   * one's referenced and exclusive bytes.
   */
  async list(
    tenantId: string,
    id: string,
    want: SnapshotExtras = {},
    signal?: AbortSignal,
  ): Promise<SnapshotInfo[]> {
    await this.deps.sessions.requireOwned(tenantId, id)
    const all = await this.snapshots.list(id)
    if (!want.digest && !want.sizes) return all
    const out: SnapshotInfo[] = []
    for (const snap of all) out.push(await this.measures.withExtras(tenantId, snap, want, signal))
    return out
  }

  async getSnapshot(
    tenantId: string,
    id: string,
    snapshotId: string,
    want: SnapshotExtras = {},
    signal?: AbortSignal,
  ) {
    await this.deps.sessions.requireOwned(tenantId, id)
    const snap = await this.snapshots.get(id, snapshotId)
    if (!snap) throw new CairnProblem('not_found', `No snapshot ${snapshotId} in session ${id}`)
    return this.measures.withExtras(tenantId, snap, want, signal)
  }

  /**
   * Deletes one snapshot and frees what it alone held (btrfs frees it in the background, within
   * seconds). Refused with `snapshot_in_use` while a restore, fork or export reads it; marked
   * deleted in the same tick as that check, so none can pick it afterwards.
   */
  async deleteSnapshot(tenantId: string, id: string, snapshotId: string): Promise<void> {
    await this.deps.sessions.requireOwned(tenantId, id)
    const snap = await this.snapshots.get(id, snapshotId)
    if (!snap) throw new CairnProblem('not_found', `No snapshot ${snapshotId} in session ${id}`)
    if (!this.pins.claimForDeletion(snap.id)) {
      throw new CairnProblem(
        'snapshot_in_use',
        `snapshot ${snap.id} is being read by a restore, fork or export; try again once it is done`,
      )
    }
    await this.snapshots.markDeleted(snap.id, this.now())
    // The next turn that changed nothing can no longer stand on it: it takes a new snapshot.
    if (this.marks.get(id)?.snapshotId === snap.id) this.marks.delete(id)
    await this.deps.runtime.pool.deleteSnapshot(snap.id)
  }

  private async pick(
    row: SessionRow,
    body: { snapshotId?: string | undefined; turn?: number | undefined },
  ): Promise<SnapshotInfo> {
    if (body.snapshotId) {
      const found = await this.snapshots.get(row.id, body.snapshotId)
      if (!found) throw new CairnProblem('not_found', `No snapshot ${body.snapshotId} in session ${row.id}`)
      return found
    }
    if (body.turn !== undefined) {
      const found = await this.snapshots.atTurn(row.id, body.turn)
      if (!found)
        throw new CairnProblem('not_found', `No snapshot of session ${row.id} follows turn ${body.turn}`)
      return found
    }
    throw new CairnProblem('validation_failed', 'give snapshotId or turn')
  }

  /** Replaces the workspace with the snapshot (the warm sandbox is stopped first). */
  async restore(
    tenantId: string,
    id: string,
    body: RestoreBody,
  ): Promise<{ session: SessionInfo; snapshot: SnapshotInfo }> {
    await this.pending.get(id)
    return this.deps.sessions.exclusive(
      tenantId,
      id,
      'a restore',
      async (row) => {
        const target = await this.pick(row, body)
        // Pinned from the moment it is picked: retention leaves it alone until the restore is done.
        return this.pins.hold(target.id, async () => {
          if (body.policy) this.deps.sessions.validatePolicy(row, body.policy)
          this.dirty.add(id)
          this.marks.delete(id)
          await this.deps.sessions.stopSandbox(id)
          // A restore is a new generation (the marker is set on the incoming copy before the swap).
          const generation = (await this.deps.sessions.store.generationOf(id)) + 1
          await this.fromSnapshot(target, () =>
            this.deps.runtime.pool.restoreWorkspace(id, target.id, generation, row.tenant_id),
          )
          await this.deps.sessions.store.setGeneration(id, generation)
          await this.deps.sessions.store.transition(
            row,
            row.status,
            'workspace_restored',
            this.now(),
            `${target.id} (after turn ${target.turn}), generation ${generation}`,
          )
          if (body.policy)
            await this.deps.sessions.updatePolicy(
              await this.deps.sessions.requireOwned(tenantId, id),
              body.policy,
              false,
            )
          return { session: await this.deps.sessions.get(tenantId, id), snapshot: target }
        })
      },
      SWAPS_WORKSPACE,
    )
  }

  /**
   * Runs a copy from a pinned snapshot. Retention marks a snapshot deleted before it removes it
   * and never touches a pinned one, so a picked snapshot stays; should it vanish all the same (an
   * operator's hand in the pool), the copy says so instead of failing with a 500 storage error.
   */
  private async fromSnapshot<T>(snap: SnapshotInfo, copy: () => Promise<T>): Promise<T> {
    try {
      return await copy()
    } catch (error) {
      if (!existsSync(this.deps.runtime.pool.snapshotPath(snap.id)))
        throw new CairnProblem(
          'not_found',
          `snapshot ${snap.id} is gone from the storage pool; list the snapshots and pick another`,
        )
      throw error
    }
  }

  /** Restores the snapshot taken before the last turn. */
  async undo(tenantId: string, id: string): Promise<{ session: SessionInfo; snapshot: SnapshotInfo }> {
    await this.pending.get(id)
    const row = await this.deps.sessions.requireOwned(tenantId, id)
    if (row.turn_count === 0) throw new CairnProblem('conflict', `session ${id} has no turn to undo`)
    const before = await this.snapshots.atTurn(id, row.turn_count - 1)
    if (!before)
      throw new CairnProblem('not_found', `no snapshot before turn ${row.turn_count} of session ${id}`)
    return this.restore(tenantId, id, { snapshotId: before.id })
  }

  /** A new session whose workspace is the snapshot and whose transcript is the parent's up to its turn. */
  async fork(tenantId: string, id: string, body: ForkBody): Promise<SessionInfo> {
    await this.pending.get(id)
    const row = await this.deps.sessions.requireOwned(tenantId, id)
    const source = await this.pick(row, body)
    // Asked by turn, the snapshot may be one taken earlier that also stands for that turn (the
    // turns between wrote nothing): the transcript still goes up to the turn asked for.
    const turnsUpTo = body.snapshotId ? source.turn : (body.turn ?? source.turn)
    // The fork inherits the parent's whole policy; the request may override any of it.
    const policy = applyPolicy(policyOf(row), body.policy)
    if (policy.maxTurns !== null && source.turn >= policy.maxTurns) {
      throw new CairnProblem(
        'turn_limit_reached',
        `a fork at turn ${source.turn} would have no turn left under maxTurns ${policy.maxTurns}; give a higher policy.maxTurns (or null)`,
        { maxTurns: policy.maxTurns, turnCount: source.turn },
      )
    }
    const childId = newId('session')
    await this.pins.hold(source.id, () =>
      this.fromSnapshot(source, () =>
        this.deps.runtime.pool.forkWorkspace(childId, source.id, row.tenant_id),
      ),
    )
    try {
      // The snapshot carries the marker of the generation it was taken at; the child starts there.
      const [marked] = await this.deps.runtime.pool.readGenerations([childId])
      const generation = marked ?? source.generation
      if (marked === undefined) await this.deps.runtime.pool.writeGeneration(childId, generation)
      await this.deps.sessions.store.insert(
        {
          id: childId,
          tenant_id: tenantId,
          agent_id: row.agent_id,
          revision_id: row.revision_id,
          title: body.title ?? (row.title ? `${row.title} (fork)` : null),
          status: 'idle',
          status_cause: 'forked',
          ...policyColumns(policy, this.deps.clock.now()),
          auto_snapshots: row.auto_snapshots,
          generation,
          created_at: this.now(),
        },
        { parentId: id, snapshotId: source.id, turnsUpTo },
      )
    } catch (error) {
      // The fork's error is the one to answer; a half-made child workspace left behind is logged.
      await this.deps.runtime.pool
        .deleteWorkspace(childId)
        .catch((e: unknown) =>
          this.deps.logger.warn({ err: e, workspace: childId }, 'removing a failed fork failed'),
        )
      throw error
    }
    return await this.deps.sessions.get(tenantId, childId)
  }

  /** Root of a session's workspace, or of one of its snapshots, on the host. */
  private async root(tenantId: string, id: string, snapshotId?: string): Promise<string> {
    return this.rootOf(await this.deps.sessions.requireLive(tenantId, id), snapshotId)
  }

  /** `root` for a session already read (and found not deleted). */
  private async rootOf(row: SessionRow, snapshotId?: string): Promise<string> {
    const { id } = row
    const { pool } = this.deps.runtime
    if (snapshotId) {
      if (!(await this.snapshots.get(id, snapshotId)))
        throw new CairnProblem('not_found', `No snapshot ${snapshotId} in session ${id}`)
      return pool.snapshotPath(snapshotId)
    }
    const dir = pool.workspacePath(id)
    if (!existsSync(dir)) throw await this.deps.sessions.missingWorkspace(row.tenant_id, id)
    return dir
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
    return this.reading(tenantId, id, snapshotId, () => listDirectory(root, rel, options), WALK)
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
        openTreeFile(root, rel, { ...options, background: true }),
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
    const root = await this.root(tenantId, id)
    await this.deps.sessions.changingWorkspace(id, async () => {
      await this.pending.get(id)
      this.dirty.add(id)
      await writeWorkspaceFile(this.deps.runtime, root, workspaceRelative(rawPath), body)
      await this.deps.sessions.advanceGeneration(id)
    })
    await this.deps.sessions.store.touch(id, this.now())
  }

  async deleteFile(tenantId: string, id: string, rawPath: string): Promise<void> {
    const root = await this.root(tenantId, id)
    await this.deps.sessions.changingWorkspace(id, async () => {
      await this.pending.get(id)
      this.dirty.add(id)
      await deleteWorkspacePath(this.deps.runtime, root, workspaceRelative(rawPath))
      // At a full quota the marker (an xattr) cannot be written even though the delete went
      // through (with simple quotas, data a snapshot still holds keeps counting): the generation
      // stays, as after a turn that ends at a full quota, and the delete is answered as done.
      await this.deps.sessions.advanceGeneration(id).catch((error: unknown) => {
        if (!(error instanceof CairnProblem && error.code === 'quota_exceeded')) throw error
        this.deps.logger.warn({ sessionId: id }, 'the workspace generation stays: its quota is full')
      })
    })
    await this.deps.sessions.store.touch(id, this.now())
  }

  /**
   * Files added, changed and deleted since the revision (`from` absent or `revision`) or a
   * snapshot. Two walks of whole trees: a heavy read of the tenant's (`rate_limited` beyond its
   * slots), under nice.
   */
  async diff(tenantId: string, id: string, from?: string, options: ReadOptions = {}): Promise<WorkspaceDiff> {
    const row = await this.deps.sessions.requireLive(tenantId, id)
    const root = await this.rootOf(row)
    const { pool } = this.deps.runtime
    const walk = { ...options, background: true }
    if (!from || from === 'revision')
      return this.heavyReads.run(tenantId, 'a diff', () =>
        this.deps.sessions.readingWorkspace(
          tenantId,
          id,
          () => diffTrees(pool.revisionPath(row.revision_id), root, row.revision_id, undefined, walk),
          WALK,
        ),
      )
    if (!(await this.snapshots.get(id, from)))
      throw new CairnProblem('not_found', `No snapshot ${from} in session ${id}`)
    return this.heavyReads.run(tenantId, 'a diff', () =>
      this.deps.sessions.readingWorkspace(
        tenantId,
        id,
        () => diffTrees(pool.snapshotPath(from), root, from, undefined, walk),
        WALK,
      ),
    )
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
        dir = await this.rootOf(row, snapshotId)
        // Pinned until the stream is done, as for a restore: retention prunes it on a later pass.
        let unpin = () => {}
        void this.pins.hold(snapshotId, () => new Promise<void>((resolve) => (unpin = resolve)))
        releaseTree = async () => void unpin()
      } else {
        await this.rootOf(row)
        const temp = newId('snapshot')
        await this.deps.sessions.readingWorkspace(tenantId, id, () => this.frozenSnapshot(row, temp))
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
    await this.root(tenantId, id)
    const summary = await inspectArchive(archive, this.deps.archiveLimits ?? DEFAULT_ARCHIVE_LIMITS)
    await this.pending.get(id)
    return this.deps.sessions.exclusive(
      tenantId,
      id,
      'an import',
      async (row) => {
        const { pool } = this.deps.runtime
        const before = await this.deps.manualSnapshotCap.within(row, () =>
          this.take(row, 'manual', 'before_import', row.turn_count),
        )
        this.dirty.add(id)
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

  /**
   * After a crash, gives every interrupted turn its pre-turn snapshot. The prompt reaches the agent
   * only once that snapshot is recorded, so a turn without one never ran: its workspace is still
   * the state before it, and the snapshot taken now is exact. (Either the transcript shows the turn
   * and the snapshot before it exists, or neither.)
   */
  async completeInterruptedTurns(turns: InterruptedTurn[]): Promise<number> {
    let taken = 0
    for (const turn of turns) {
      const row = await this.deps.sessions.store.get(turn.tenantId, turn.sessionId)
      if (!row?.auto_snapshots || row.status === 'deleted' || row.status_cause === 'state_lost') continue
      if (await this.snapshots.atTurn(row.id, turn.seq - 1)) continue
      if (!(await this.deps.runtime.pool.hasWorkspace(row.id))) continue
      await this.take(row, 'auto', 'before_turn', turn.seq - 1)
      taken++
    }
    return taken
  }

  /** Waits for background retention work (used on shutdown and by tests). */
  async settle(): Promise<void> {
    await Promise.all(this.pending.values())
    await this.retention
  }

  /** Removes every snapshot of a deleted session. */
  async deleteAll(sessionId: string): Promise<void> {
    await this.retention
    for (const snap of await this.snapshots.list(sessionId)) {
      await this.snapshots.markDeleted(snap.id, this.now())
      await this.deps.runtime.pool.deleteSnapshot(snap.id)
    }
  }

  /** `withSizes` measures the live workspace too (a walk of its extents without btrfs quotas). */
  /** Typed by the wire schema: a field the schema lacks would be dropped from the answer, so it fails to compile. */
  async manifest(tenantId: string, id: string, withSizes = false): Promise<SessionManifest> {
    const session = await this.deps.sessions.get(tenantId, id)
    const row = await this.deps.sessions.requireOwned(tenantId, id)
    const revision = await this.deps.agents.store.revision(row.revision_id)
    const turns = await this.deps.sessions.store.turns(id)
    const last = turns[turns.length - 1]
    const workspacePath = this.deps.runtime.pool.workspacePath(id)
    const present = existsSync(workspacePath)
    const dirty = present ? await this.diff(tenantId, id) : undefined
    const workspaceSizes =
      withSizes && present
        ? await this.deps.sessions.readingWorkspace(tenantId, id, () => this.measures.measure(workspacePath))
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
      baseImage: 'host /usr, read-only (bwrap)',
      driver: revision?.manifest.isolation ?? this.deps.runtime.driver.name,
      storage: this.deps.runtime.pool.driver,
      setupVersion: revision?.manifest.setup ? revision.contentHash : null,
      sessionSetup: await this.sessionSetup(id),
      generation: row.generation,
      parentSessionId: row.parent_session_id,
      forkedFromSnapshotId: row.forked_from_snapshot_id,
      snapshotIds: (await this.snapshots.list(id)).map((s) => s.id),
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
      limits: revision?.manifest.limits ?? {},
      // Services listening inside the running sandbox, reachable as previews (…/ports/{port}/).
      openPorts: (await this.deps.sessions.warmAgent(id)?.listeningPorts()) ?? [],
      policies: {
        ...policyOf(row),
        deadlineAt: row.deadline_at,
        keepAutoSnapshots: (await this.deps.keepAutoSnapshots?.(tenantId)) ?? 50,
      },
    }
  }
}
