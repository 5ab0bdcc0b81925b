import type { Readable } from 'node:stream'
import { CairnProblem, newId, type SessionMove } from '@cairn/protocol'
import { type RuntimePort, runWithOwnerEpoch, type ShippedHead } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { Db } from '../../db/database.js'
import type { SessionService } from '../../sessions/session-service.js'
import { MOVE_OPERATION } from '../../sessions/turn-locks.js'
import { dbNow } from '../db-time.js'
import type { ClusterRuntimePort } from '../routing/cluster-runtime-port.js'
import type { NodeRow } from '../routing/node-directory.js'

/** What `checkpointForFork` answers for a sandbox that has no memory to carry. */
const CANNOT_CHECKPOINT = new Set(['sandbox_not_running', 'bad_request', 'capability_unavailable'])

export interface SessionMoverDeps {
  db: Db
  cluster: ClusterRuntimePort
  sessions: SessionService
  logger: Logger
  /** How long the last increment may take to reach the bucket (default 60 s). */
  shipWaitMs?: number
}

/**
 * Moves a session's workspace from the node that owns it to another, then its ownership. The
 * session is held exclusively the whole time (as a restore holds it: no turn, no file change, no
 * read of a half-swapped workspace starts meanwhile; a message answers `session_moving`, 409
 * retryable). Its warm sandbox (if any) is stopped and a last snapshot taken on the source. When
 * both nodes ship to the bucket, that snapshot is shipped (an increment on the chain the node has
 * been shipping after every turn) and the target restores the session from the bucket; without
 * one it is exported and unpacked on the target at the same generation. The two digests are
 * compared; then, in one transaction, `sessions.runtime_id` becomes the target and
 * `owner_epoch` one more, checked against what the move started from (a turn that slipped in
 * from another replica, or a leader declaring the node lost, aborts the move and the target's
 * copy is dropped); the session's events record `moved` (from → to). Last the source's copy and
 * the move's snapshot are deleted (under the new epoch: the source then refuses the old owner).
 * Through the bucket, the move's snapshot (restored into the target's pool) is recorded in the
 * same transaction as an automatic snapshot after the session's last turn: it is the session's
 * newest chain link.
 */
export class SessionMover {
  constructor(private readonly deps: SessionMoverDeps) {}

  /** Moves the session whatever its tenant (the caller is the install's admin, or the leader). */
  async moveById(sessionId: string, toNode?: string): Promise<SessionMove> {
    const row = await this.deps.db.q
      .selectFrom('sessions')
      .select('tenant_id')
      .where('id', '=', sessionId)
      .executeTakeFirst()
    if (!row) throw new CairnProblem('session_not_found', `No session found matching '${sessionId}'`)
    return this.move(row.tenant_id, sessionId, toNode)
  }

  /**
   * Moves the session; a turn running when it is asked is waited for (up to `waitMs`, then the
   * move answers `session_busy`), as is a file change through the API.
   */
  async move(tenantId: string, sessionId: string, toNode?: string, waitMs = 30_000): Promise<SessionMove> {
    const deadline = performance.now() + waitMs
    for (;;) {
      try {
        return await this.moveOnce(tenantId, sessionId, toNode)
      } catch (error) {
        if (!(error instanceof CairnProblem) || error.code !== 'session_busy' || performance.now() > deadline)
          throw error
        await new Promise((resolve) => setTimeout(resolve, 25))
      }
    }
  }

  private async moveOnce(tenantId: string, sessionId: string, toNode?: string): Promise<SessionMove> {
    const { sessions } = this.deps
    const startedMs = performance.now()
    return sessions.exclusive(
      tenantId,
      sessionId,
      MOVE_OPERATION,
      async (row) => {
        const fromNode = row.runtime_id
        if (fromNode === null)
          throw new CairnProblem('conflict', `session ${sessionId} has no node to move from`)
        const epoch = Number(row.owner_epoch)
        const target = await this.target(fromNode, row.revision_id, toNode)
        const source = await this.deps.cluster.nodePort(fromNode)
        const onSource = <T>(fn: (port: RuntimePort) => Promise<T>) =>
          runWithOwnerEpoch(epoch, () => fn(source.port))
        const onTarget = <T>(fn: (port: RuntimePort) => Promise<T>) =>
          runWithOwnerEpoch(epoch + 1, () => fn(target.port))
        // A sandbox that can be checkpointed goes along with its memory (its warm sandbox is
        // checkpointed here, which stops it); any other is stopped, as its next turn starts cold.
        const memory = await this.takeMemory(sessionId, onSource)
        if (!memory) await onSource((port) => port.stopAgent(sessionId))
        const [generation] = await onSource((port) => port.readGenerations([sessionId]))
        // Through the bucket when both nodes ship to one: the node has shipped the session's
        // snapshots as they were taken, so only the last increment crosses now, and the target
        // continues the session's chain. Else straight from node to node through the port.
        const viaBucket = await this.bothShip(source.port, target.port)
        const snapshotId = newId('snapshot')
        await onSource((port) =>
          port.snapshotWorkspace(
            sessionId,
            snapshotId,
            row.tenant_id,
            viaBucket ? { ship: true } : undefined,
          ),
        )
        let created = false
        let moved = false
        try {
          const digest = await onSource((port) => port.digest({ snapshotId }))
          await this.deps.cluster.ensureRevisionOn(target.node, row.revision_id)
          if (viaBucket) {
            const head = await this.shipped(sessionId, snapshotId)
            created = true
            const restored = await onTarget((port) => port.restoreFromBucket(sessionId, row.tenant_id, head))
            if (restored.snapshotId !== snapshotId)
              throw new CairnProblem(
                'conflict',
                `the bucket's newest link of session ${sessionId} is snapshot ${restored.snapshotId}, not the move's ${snapshotId}; the session stays on ${fromNode}`,
              )
          } else {
            const archive = await onSource(async (port) => {
              const { stream } = await port.exportTree({ snapshotId })
              return readAll(stream)
            })
            await onTarget((port) => port.createWorkspace(sessionId, row.revision_id, row.tenant_id))
            created = true
            await onTarget((port) =>
              port.replaceWorkspaceWithArchive(
                sessionId,
                row.tenant_id,
                archive,
                generation ?? row.generation,
              ),
            )
          }
          const copied = await onTarget((port) => port.digest({ sessionId }))
          if (copied !== digest)
            throw new CairnProblem(
              'storage_error',
              `the copy of session ${sessionId} on node ${target.node.id} differs from its source (${copied} ≠ ${digest}); the session stays on ${fromNode}`,
            )
          if (memory)
            await onTarget((port) => port.importMemory(sessionId, memory, generation ?? row.generation))
          await this.changeOwner(
            sessionId,
            fromNode,
            target.node.id,
            epoch,
            { turnCount: Number(row.turn_count), generation: Number(row.generation) },
            // Through the bucket the move's snapshot is a chain link, and now in the target's pool:
            // recorded, so a later recovery (or a database restored from a backup) knows the turn it
            // stands for and names no turn before it as lost.
            viaBucket
              ? { snapshotId, tenantId: row.tenant_id, generation: generation ?? row.generation }
              : undefined,
          )
          moved = true
          this.deps.cluster.forgetHome(sessionId)
          await runWithOwnerEpoch(epoch + 1, async () => {
            // The source's checkpoint, if any, with its copy: the target's is the session's now.
            if (memory) await source.port.stopAgent(sessionId)
            await source.port.deleteWorkspace(sessionId)
            await source.port.deleteSnapshot(snapshotId)
          }).catch((error: unknown) =>
            this.deps.logger.warn(
              { err: error, session: sessionId, node: fromNode },
              "deleting a moved session's source copy failed (it is no longer the session's)",
            ),
          )
          return {
            sessionId,
            fromNode,
            toNode: target.node.id,
            ownerEpoch: epoch + 1,
            via: viaBucket ? 'bucket' : 'direct',
            digest,
            ...(memory ? { memoryBytes: memory.length } : {}),
            durationMs: Math.round(performance.now() - startedMs),
          }
        } finally {
          // The move did not happen: the session stays the source's, the target's copy goes.
          if (!moved) {
            if (created) await onTarget((port) => port.deleteWorkspace(sessionId)).catch(() => undefined)
            // The source keeps its checkpoint: the session's next message there restores it.
            if (memory) await onTarget((port) => port.stopAgent(sessionId)).catch(() => undefined)
            await onSource((port) => port.deleteSnapshot(snapshotId)).catch(() => undefined)
          }
        }
      },
      true,
    )
  }

  /**
   * The session's running state as a checkpoint archive when its sandbox can be checkpointed (a
   * warm `pause: memory` sandbox under gVisor, or the checkpoint its pause kept); undefined when
   * it cannot or has none, and the move carries the workspace alone.
   */
  private async takeMemory(
    sessionId: string,
    onSource: <T>(fn: (port: RuntimePort) => Promise<T>) => Promise<T>,
  ): Promise<Buffer | undefined> {
    try {
      await onSource((port) => port.checkpointForFork(sessionId))
    } catch (error) {
      if (error instanceof CairnProblem && CANNOT_CHECKPOINT.has(error.code)) return undefined
      throw error
    }
    return onSource(async (port) => readAll((await port.exportMemory(sessionId)).stream))
  }

  /** Whether both nodes ship to a bucket (the same one: a cluster's nodes share one). */
  private async bothShip(source: RuntimePort, target: RuntimePort): Promise<boolean> {
    const [from, to] = await Promise.all([source.shippingLag(), target.shippingLag()])
    return from.enabled && to.enabled
  }

  /**
   * Waits until the node recorded the snapshot's chain link as confirmed in the bucket
   * (`sessions.shipped_snapshot_id`, written by the node at the owner epoch it was taken under);
   * `shipping_failed` (retryable) when it does not come within `shipWaitMs`. Resolves to that
   * link's number and tree digest as recorded: the restore is pinned to them, never to whatever
   * is newest in the bucket (docs/security.md).
   */
  private async shipped(sessionId: string, snapshotId: string): Promise<ShippedHead> {
    const deadline = performance.now() + (this.deps.shipWaitMs ?? 60_000)
    for (;;) {
      const row = await this.deps.db.q
        .selectFrom('sessions')
        .select(['shipped_snapshot_id', 'shipped_link_seq', 'shipped_tree_digest'])
        .where('id', '=', sessionId)
        .executeTakeFirst()
      if (
        row?.shipped_snapshot_id === snapshotId &&
        row.shipped_link_seq !== null &&
        row.shipped_tree_digest !== null
      )
        return { seq: Number(row.shipped_link_seq), treeDigest: row.shipped_tree_digest }
      if (performance.now() > deadline)
        throw new CairnProblem(
          'shipping_failed',
          `the last increment of session ${sessionId} did not reach the bucket in time; the session stays where it is (retry the move)`,
        )
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
  }

  /** The node to move to: the one asked for, if it takes sessions; else placement's pick. */
  private async target(
    fromNode: string,
    revisionId: string,
    toNode: string | undefined,
  ): Promise<{ node: NodeRow; port: RuntimePort }> {
    if (toNode === undefined) return this.deps.cluster.placeMove(revisionId, fromNode)
    if (toNode === fromNode)
      throw new CairnProblem('conflict', `the session already lives on node ${toNode}`, { nodeId: toNode })
    const target = await this.deps.cluster.nodePort(toNode, true)
    if (target.node.state !== 'ready')
      throw new CairnProblem(
        'conflict',
        `node ${toNode} is ${target.node.state}: it takes no sessions (uncordon it first)`,
        { nodeId: toNode, state: target.node.state },
      )
    return target
  }

  /** The owner and its epoch change in one transaction, only if nothing changed them meanwhile. */
  private async changeOwner(
    sessionId: string,
    fromNode: string,
    toNode: string,
    epoch: number,
    seen: { turnCount: number; generation: number },
    link?: { snapshotId: string; tenantId: string; generation: number },
  ): Promise<void> {
    const { db } = this.deps
    await db.transaction(async () => {
      const at = await dbNow(db)
      const row = await db.q
        .selectFrom('sessions')
        .select(['runtime_id', 'owner_epoch', 'status', 'turn_count', 'generation'])
        .where('id', '=', sessionId)
        .forUpdate()
        .executeTakeFirst()
      if (!row || row.runtime_id !== fromNode || Number(row.owner_epoch) !== epoch)
        throw new CairnProblem(
          'conflict',
          `session ${sessionId} changed owner while it was being moved (now ${row?.runtime_id ?? 'gone'} at epoch ${row?.owner_epoch ?? '?'}); the move was dropped`,
        )
      if (row.status === 'deleted')
        throw new CairnProblem('session_deleted', `session ${sessionId} was deleted`)
      const running = await db.q
        .selectFrom('turns')
        .select('id')
        .where('session_id', '=', sessionId)
        .where('status', '=', 'running')
        .executeTakeFirst()
      // A turn begun and ended through another replica while the copy was made: its changes may
      // not be in the copy.
      if (running || Number(row.turn_count) !== seen.turnCount || Number(row.generation) > seen.generation)
        throw new CairnProblem(
          'session_busy',
          `session ${sessionId} ran a turn${running ? ` (${running.id})` : ''} through another replica during the move; the move was dropped (retry it)`,
        )
      await db.q
        .updateTable('sessions')
        .set((eb) => ({
          runtime_id: toNode,
          owner_epoch: eb('owner_epoch', '+', 1),
          status_cause: 'moved',
          updated_at: at,
        }))
        .where('id', '=', sessionId)
        .execute()
      await db.q
        .insertInto('session_events')
        .values({
          id: newId('event'),
          session_id: sessionId,
          from_status: row.status,
          to_status: row.status,
          cause: 'moved',
          detail: `${fromNode} → ${toNode} (owner epoch ${epoch} → ${epoch + 1})`,
          at,
        })
        .execute()
      if (link)
        await db.q
          .insertInto('snapshots')
          .values({
            id: link.snapshotId,
            session_id: sessionId,
            tenant_id: link.tenantId,
            kind: 'auto',
            reason: 'before_turn',
            label: null,
            turn_seq: seen.turnCount,
            generation: link.generation,
            created_at: at,
          })
          .execute()
    })
  }
}

async function readAll(stream: Readable): Promise<Buffer> {
  const chunks: Buffer[] = []
  for await (const chunk of stream) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk))
  return Buffer.concat(chunks)
}
