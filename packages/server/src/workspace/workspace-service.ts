import { existsSync } from 'node:fs'

import type { Readable } from 'node:stream'
import {
  CairnProblem,
  type FileEntry,
  type ForkBody,
  newId,
  type RestoreBody,
  type SessionInfo,
  type SnapshotInfo,
  type SnapshotReason,
  type WorkspaceDiff,
} from '@cairn/protocol'
import type { AgentProcess, Runtime } from '@cairn/runtime'
import type { Logger } from 'pino'
import * as tar from 'tar'
import type { AgentService } from '../agents/agent-service.js'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import { openInside, resolveInside, workspaceRelative } from '../files/confine.js'
import { deleteWorkspacePath, writeWorkspaceFile } from '../files/sandboxed-io.js'
import { diffTrees, listDirectory } from '../files/tree.js'
import { applyPolicy, deadlineFor, policyOf } from '../sessions/policy.js'
import type { SessionService } from '../sessions/session-service.js'
import type { InterruptedTurn, SessionRow } from '../sessions/session-store.js'
import { SnapshotStore } from '../snapshots/snapshot-store.js'

export interface WorkspaceServiceDeps {
  db: Db
  runtime: Runtime
  sessions: SessionService
  agents: AgentService
  clock: Clock
  logger: Logger
  /** Automatic snapshots kept per session (manual ones are kept until deleted). */
  keepAutoSnapshots?: (tenantId: string) => number
}

/**
 * The session workspace as a versioned object: snapshots (frozen, O(1)), exact restore, fork,
 * files, diff and export. Every mutation holds the session's turn lock.
 */
export class WorkspaceService {
  readonly snapshots: SnapshotStore
  private retention: Promise<void> = Promise.resolve()
  private readonly pending = new Map<string, Promise<void>>()
  /** Sessions whose workspace changed outside a turn since their last snapshot. */
  private readonly dirty = new Set<string>()

  constructor(private readonly deps: WorkspaceServiceDeps) {
    this.snapshots = new SnapshotStore(deps.db)
    // The snapshot that lets turn N be undone is the state after turn N-1. It is taken as soon as
    // turn N-1 ends (the agent is waiting for input), off the critical path of the reply; turn N
    // waits for it, and takes one itself when something changed the workspace in between.
    deps.sessions.onAfterTurn((row, seq, agent) => {
      if (!row.auto_snapshots) return
      this.track(row.id, this.take(row, 'auto', 'before_turn', seq, agent?.alive ? agent : undefined))
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
      if (this.dirty.has(row.id) || !this.snapshots.atTurn(row.id, seq - 1)) {
        this.dirty.delete(row.id)
        await this.take(row, 'auto', 'before_turn', seq - 1, agent)
      }
    })
    deps.sessions.onDeleted((sessionId) => this.deleteAll(sessionId))
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
    await this.frozenSnapshot(row.id, snapshotId, agent)
    const current = this.deps.sessions.store.get(row.tenant_id, row.id)
    const info = this.snapshots.insertWithId(snapshotId, {
      session_id: row.id,
      tenant_id: row.tenant_id,
      kind,
      reason,
      label: label ?? null,
      turn_seq: turnSeq,
      generation: current?.generation ?? row.generation,
      created_at: this.now(),
    })
    // Pruning old automatic snapshots is off the turn's critical path, serialised per service.
    if (kind === 'auto')
      this.retention = this.retention
        .then(() => this.applyRetention(row.id, row.tenant_id))
        .catch(() => undefined)
    return info
  }

  /** A read-only snapshot of the workspace with the session's warm sandbox (if any) frozen. */
  private async frozenSnapshot(sessionId: string, snapshotId: string, agent?: AgentProcess): Promise<void> {
    const warm = agent ?? this.deps.sessions.warmAgent(sessionId)
    await warm?.freeze()
    try {
      await this.deps.runtime.pool.snapshotWorkspace(sessionId, snapshotId)
    } finally {
      await warm?.thaw()
    }
  }

  private async applyRetention(sessionId: string, tenantId: string): Promise<void> {
    const keep = this.deps.keepAutoSnapshots?.(tenantId) ?? 50
    for (const old of this.snapshots.expiredAuto(sessionId, keep)) {
      await this.deps.runtime.pool.deleteSnapshot(old.id)
      this.snapshots.markDeleted(old.id, this.now())
    }
  }

  async snapshot(tenantId: string, id: string, label?: string): Promise<SnapshotInfo> {
    await this.pending.get(id)
    return this.deps.sessions.exclusive(tenantId, id, 'a snapshot', (row) =>
      this.take(row, 'manual', 'manual', row.turn_count, undefined, label),
    )
  }

  list(tenantId: string, id: string): SnapshotInfo[] {
    this.deps.sessions.require(tenantId, id)
    return this.snapshots.list(id)
  }

  private pick(
    row: SessionRow,
    body: { snapshotId?: string | undefined; turn?: number | undefined },
  ): SnapshotInfo {
    if (body.snapshotId) {
      const found = this.snapshots.get(row.id, body.snapshotId)
      if (!found) throw new CairnProblem('not_found', `No snapshot ${body.snapshotId} in session ${row.id}`)
      return found
    }
    if (body.turn !== undefined) {
      const found = this.snapshots.atTurn(row.id, body.turn)
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
    return this.deps.sessions.exclusive(tenantId, id, 'a restore', async (row) => {
      const target = this.pick(row, body)
      if (body.policy) this.deps.sessions.validatePolicy(row, body.policy)
      this.dirty.add(id)
      await this.deps.sessions.stopSandbox(id)
      // A restore is a new generation (the marker is set on the incoming copy before the swap).
      const generation = this.deps.sessions.store.generationOf(id) + 1
      await this.deps.runtime.pool.restoreWorkspace(id, target.id, generation)
      this.deps.sessions.store.setGeneration(id, generation)
      this.deps.sessions.store.transition(
        row,
        row.status,
        'workspace_restored',
        this.now(),
        `${target.id} (after turn ${target.turn}), generation ${generation}`,
      )
      if (body.policy)
        this.deps.sessions.updatePolicy(this.deps.sessions.require(tenantId, id), body.policy, false)
      return { session: this.deps.sessions.get(tenantId, id), snapshot: target }
    })
  }

  /** Restores the snapshot taken before the last turn. */
  async undo(tenantId: string, id: string): Promise<{ session: SessionInfo; snapshot: SnapshotInfo }> {
    await this.pending.get(id)
    const row = this.deps.sessions.require(tenantId, id)
    if (row.turn_count === 0) throw new CairnProblem('conflict', `session ${id} has no turn to undo`)
    const before = this.snapshots.atTurn(id, row.turn_count - 1)
    if (!before)
      throw new CairnProblem('not_found', `no snapshot before turn ${row.turn_count} of session ${id}`)
    return this.restore(tenantId, id, { snapshotId: before.id })
  }

  /** A new session whose workspace is the snapshot and whose transcript is the parent's up to its turn. */
  async fork(tenantId: string, id: string, body: ForkBody): Promise<SessionInfo> {
    await this.pending.get(id)
    const row = this.deps.sessions.require(tenantId, id)
    const source = this.pick(row, body)
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
    await this.deps.runtime.pool.forkWorkspace(childId, source.id)
    try {
      // The snapshot carries the marker of the generation it was taken at; the child starts there.
      const [marked] = await this.deps.runtime.pool.readGenerations([childId])
      const generation = marked ?? source.generation
      if (marked === undefined) await this.deps.runtime.pool.writeGeneration(childId, generation)
      this.deps.sessions.store.insert(
        {
          id: childId,
          tenant_id: tenantId,
          agent_id: row.agent_id,
          revision_id: row.revision_id,
          title: body.title ?? (row.title ? `${row.title} (fork)` : null),
          status: 'idle',
          status_cause: 'forked',
          idle_timeout_ms: policy.idleTimeoutMs,
          keep_warm_ms: policy.keepWarmMs,
          max_turns: policy.maxTurns,
          max_duration_ms: policy.maxDurationMs,
          deadline_at: deadlineFor(policy, this.deps.clock.now()),
          on_timeout: policy.onTimeout,
          auto_snapshots: row.auto_snapshots,
          generation,
          created_at: this.now(),
        },
        { parentId: id, snapshotId: source.id, turnsUpTo: source.turn },
      )
    } catch (error) {
      await this.deps.runtime.pool.deleteWorkspace(childId).catch(() => undefined)
      throw error
    }
    return this.deps.sessions.get(tenantId, childId)
  }

  /** Root of a session's workspace, or of one of its snapshots, on the host. */
  private root(tenantId: string, id: string, snapshotId?: string): string {
    const row = this.deps.sessions.require(tenantId, id)
    if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${id} was deleted`)
    const { pool } = this.deps.runtime
    if (snapshotId) {
      if (!this.snapshots.get(id, snapshotId))
        throw new CairnProblem('not_found', `No snapshot ${snapshotId} in session ${id}`)
      return pool.snapshotPath(snapshotId)
    }
    const dir = pool.workspacePath(id)
    if (!existsSync(dir))
      throw new CairnProblem('state_lost', `the workspace of session ${id} is missing from the storage pool`)
    return dir
  }

  async listFiles(tenantId: string, id: string, rawPath: string, snapshotId?: string): Promise<FileEntry[]> {
    const root = this.root(tenantId, id, snapshotId)
    const rel = workspaceRelative(rawPath)
    const dir = await resolveInside(root, rel)
    return listDirectory(dir, rel)
  }

  async openFile(tenantId: string, id: string, rawPath: string, snapshotId?: string) {
    const root = this.root(tenantId, id, snapshotId)
    const rel = workspaceRelative(rawPath)
    const handle = await openInside(root, rel)
    const info = await handle.stat()
    if (!info.isFile()) {
      await handle.close()
      throw new CairnProblem('validation_failed', `/workspace/${rel} is not a regular file`)
    }
    return { handle, size: info.size, name: rel.split('/').pop() ?? 'file' }
  }

  async writeFile(tenantId: string, id: string, rawPath: string, body: Readable): Promise<void> {
    const root = this.root(tenantId, id)
    await this.pending.get(id)
    this.dirty.add(id)
    await writeWorkspaceFile(this.deps.runtime, root, workspaceRelative(rawPath), body)
    await this.deps.sessions.advanceGeneration(id)
    this.deps.sessions.store.touch(id, this.now())
  }

  async deleteFile(tenantId: string, id: string, rawPath: string): Promise<void> {
    const root = this.root(tenantId, id)
    await this.pending.get(id)
    this.dirty.add(id)
    await deleteWorkspacePath(this.deps.runtime, root, workspaceRelative(rawPath))
    await this.deps.sessions.advanceGeneration(id)
    this.deps.sessions.store.touch(id, this.now())
  }

  /** Files added, changed and deleted since the revision (`from` absent or `revision`) or a snapshot. */
  async diff(tenantId: string, id: string, from?: string): Promise<WorkspaceDiff> {
    const row = this.deps.sessions.require(tenantId, id)
    const root = this.root(tenantId, id)
    const { pool } = this.deps.runtime
    if (!from || from === 'revision')
      return diffTrees(pool.revisionPath(row.revision_id), root, row.revision_id)
    if (!this.snapshots.get(id, from))
      throw new CairnProblem('not_found', `No snapshot ${from} in session ${id}`)
    return diffTrees(pool.snapshotPath(from), root, from)
  }

  /** A consistent tar.gz of the workspace (taken from a temporary snapshot) or of a snapshot. */
  async export(
    tenantId: string,
    id: string,
    snapshotId?: string,
  ): Promise<{ stream: Readable; cleanup: () => Promise<void> }> {
    const row = this.deps.sessions.require(tenantId, id)
    const { pool } = this.deps.runtime
    let dir: string
    let cleanup = async () => undefined
    if (snapshotId) {
      dir = this.root(tenantId, id, snapshotId)
    } else {
      this.root(tenantId, id)
      const temp = newId('snapshot')
      await this.frozenSnapshot(row.id, temp)
      dir = pool.snapshotPath(temp)
      cleanup = async () => {
        await pool.deleteSnapshot(temp).catch(() => undefined)
      }
    }
    const stream = tar.c({ gzip: true, cwd: dir, portable: true, follow: false }, [
      '.',
    ]) as unknown as Readable
    return { stream, cleanup }
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
      const row = this.deps.sessions.store.get(turn.tenantId, turn.sessionId)
      if (!row?.auto_snapshots || row.status === 'deleted' || row.status_cause === 'state_lost') continue
      if (this.snapshots.atTurn(row.id, turn.seq - 1)) continue
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
    for (const snap of this.snapshots.list(sessionId)) {
      await this.deps.runtime.pool.deleteSnapshot(snap.id)
      this.snapshots.markDeleted(snap.id, this.now())
    }
  }

  async manifest(tenantId: string, id: string) {
    const session = this.deps.sessions.get(tenantId, id)
    const row = this.deps.sessions.require(tenantId, id)
    const revision = this.deps.agents.store.revision(row.revision_id)
    const turns = this.deps.sessions.store.turns(id)
    const last = turns[turns.length - 1]
    const dirty = existsSync(this.deps.runtime.pool.workspacePath(id))
      ? await this.diff(tenantId, id)
      : undefined
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
      setupVersion: revision?.manifest.setup ? revision.contentHash : null,
      generation: row.generation,
      parentSessionId: row.parent_session_id,
      forkedFromSnapshotId: row.forked_from_snapshot_id,
      snapshotIds: this.snapshots.list(id).map((s) => s.id),
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
      policies: {
        ...policyOf(row),
        deadlineAt: row.deadline_at,
        keepAutoSnapshots: this.deps.keepAutoSnapshots?.(tenantId) ?? 50,
      },
    }
  }
}
