import { CairnProblem, newId } from '@cairn/protocol'
import { type BucketRestore, runWithOwnerEpoch } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { Db } from '../../db/database.js'
import { dbNow } from '../db-time.js'
import type { ClusterRoutes } from './cluster-routes.js'
import type { ClusterRows } from './cluster-rows.js'
import type { RecoveryFaultAt } from './cluster-runtime-port-options.js'
import type { NodeDirectory, NodeRow } from './node-directory.js'
import type { RevisionShipping } from './revision-shipping.js'

/** What a recovery did: where the session went, from which snapshot, and which turns did not make it. */
export interface Recovered {
  sessionId: string
  fromNodeId: string
  toNodeId: string
  ownerEpoch: number
  restore: BucketRestore
  /** The turns after the restored snapshot: their changes to the workspace are not in it. */
  lostTurns: { turnId: string; seq: number; status: string }[]
  /** The event's text (session_events.detail, cause `node_recovered`). */
  detail: string
}

/** How long a replica waits for another one's recovery of the same session (a restore takes seconds). */
const RECOVERY_WAIT_MS = 30_000

export interface NodeLossRecoveryDeps {
  db: Db
  directory: NodeDirectory
  rows: ClusterRows
  routes: ClusterRoutes
  shipping: RevisionShipping
  logger: Logger
  /**
   * Fault injection (tests): called after the claim, after the restore, and inside the commit's
   * transaction before it commits; what it throws ends the recovery there, leaving what the
   * replica's death at that step would (the claim made, the target's copy, a rolled-back commit).
   */
  faultAt?: RecoveryFaultAt | undefined
}

/**
 * Brings a session of a lost node back on another node from the shipping bucket (step 3 of the
 * cluster; docs/architecture.md): the node placement picks restores the workspace from the
 * chain link the session's owner recorded (`shipped_link_seq`, `shipped_tree_digest`: a newer link
 * in the bucket may be anyone's with its keys) (`restoreFromBucket`, called under the next owner epoch, so
 * the target fences out anything older), then one transaction — only if the session is still the
 * lost node's at the epoch read — makes the target its owner with the epoch one more and the
 * restored generation, and records a `node_recovered` event naming the snapshot it came back from
 * and the turns whose changes did not make it. Never a silent rollback: the event is written in
 * the same transaction as the move. Nothing shipped: `state_lost`, and the session stays the lost
 * node's (it is served again should that node come back).
 */
export class NodeLossRecovery {
  private readonly inFlight = new Map<string, Promise<Recovered | undefined>>()

  constructor(private readonly deps: NodeLossRecoveryDeps) {}

  /** Recovers the session if its node is lost (one recovery at a time per session in this replica). */
  recover(sessionId: string): Promise<Recovered | undefined> {
    let running = this.inFlight.get(sessionId)
    if (!running) {
      running = this.run(sessionId).finally(() => this.inFlight.delete(sessionId))
      this.inFlight.set(sessionId, running)
    }
    return running
  }

  /** Recovers every session of a lost node, a few at a time (`--recover-lost eager`). */
  async recoverNode(nodeId: string, concurrency = 4): Promise<{ recovered: number; failed: number }> {
    const sessions = await this.deps.db.q
      .selectFrom('sessions')
      .select('id')
      .where('runtime_id', '=', nodeId)
      .where('status', '!=', 'deleted')
      .orderBy('id')
      .execute()
    let recovered = 0
    let failed = 0
    const queue = sessions.map((s) => s.id)
    const worker = async () => {
      for (let id = queue.shift(); id !== undefined; id = queue.shift()) {
        try {
          if (await this.recover(id)) recovered++
        } catch (error) {
          failed++
          this.deps.logger.warn({ err: error, session: id, nodeId }, 'eager recovery of a session failed')
        }
      }
    }
    await Promise.all(Array.from({ length: Math.max(1, concurrency) }, worker))
    return { recovered, failed }
  }

  private async run(sessionId: string): Promise<Recovered | undefined> {
    const { db, directory, rows, routes, shipping, logger } = this.deps
    const row = await db.q
      .selectFrom('sessions')
      .select([
        'id',
        'tenant_id',
        'revision_id',
        'runtime_id',
        'owner_epoch',
        'status',
        'generation',
        'shipped_link_seq',
        'shipped_tree_digest',
      ])
      .where('id', '=', sessionId)
      .executeTakeFirst()
    if (!row?.runtime_id || row.status === 'deleted') return undefined
    const from = (await directory.nodes(true)).find((node) => node.id === row.runtime_id)
    if (from?.state !== 'lost') return undefined
    const lostState = () =>
      new CairnProblem(
        'state_lost',
        `session ${sessionId}'s node ${from.id} was lost and nothing of its workspace was shipped to the bucket; it is served again if that node comes back`,
        { sessionId, nodeId: from.id },
      )
    const epoch = Number(row.owner_epoch) + 1
    const target = await routes.place(row.revision_id)
    const { port } = await routes.nodePort(target.id)
    // Only the link the owner recorded under its epoch is the session's: a newer one in the
    // bucket may be anyone's with the bucket's keys (docs/security.md). Nothing recorded is
    // state_lost where nodes ship; where they do not, the session waits for its node (the node's
    // own `unavailable` answer, which the caller turns back into node_lost).
    if (row.shipped_link_seq === null || row.shipped_tree_digest === null) {
      if (!(await port.shippingLag()).enabled)
        throw new CairnProblem('unavailable', `node ${target.id} has no shipping bucket`)
      throw lostState()
    }
    const expected = { seq: Number(row.shipped_link_seq), treeDigest: row.shipped_tree_digest }
    // The session is claimed before anything is restored: its owner epoch moves on while it is
    // still the lost node's, so a replica that read the same row waits instead of restoring over
    // what is written after the first one's commit. One that reads the claimed row claims it
    // again (the first may have died): the node then refuses the older epoch's restore, and a
    // commit needs the epoch its claim set, so whichever claimed last restores and commits.
    if (!(await this.claim(row, from.id, epoch))) return this.awaitOther(sessionId, from.id)
    await this.deps.faultAt?.('claimed', sessionId)
    await shipping.ensure(target, row.revision_id)
    const startedMs = performance.now()
    let restore: BucketRestore
    try {
      restore = await runWithOwnerEpoch(epoch, () =>
        port.restoreFromBucket(sessionId, row.tenant_id, expected),
      )
    } catch (error) {
      if (error instanceof CairnProblem && error.code === 'state_lost') throw lostState()
      // Another replica claimed it after this one (it read the claimed row) and reached the node
      // first: that one's restore is the session's.
      if (error instanceof CairnProblem && error.code === 'stale_epoch')
        return this.awaitOther(sessionId, from.id)
      throw error
    }
    await this.deps.faultAt?.('restored', sessionId)
    const moved = await this.commit(row, from, target, epoch, restore)
    rows.forget(sessionId)
    if (!moved) {
      // Another replica moved it first: the copy made here is not the session's workspace.
      const now = await db.q
        .selectFrom('sessions')
        .select(['runtime_id', 'owner_epoch'])
        .where('id', '=', sessionId)
        .executeTakeFirst()
      if (now?.runtime_id !== target.id)
        await runWithOwnerEpoch(epoch, () => port.deleteWorkspace(sessionId)).catch(() => undefined)
      return this.awaitOther(sessionId, from.id)
    }
    logger.info(
      {
        session: sessionId,
        from: from.id,
        to: target.id,
        snapshot: restore.snapshotId,
        generation: restore.generation,
        lostTurns: moved.lostTurns.length,
        ms: Math.round(performance.now() - startedMs),
      },
      'recovered a session of a lost node from the shipping bucket',
    )
    return moved
  }

  /** Moves the owner epoch on if the session is still the lost node's at the epoch read. */
  private async claim(row: { id: string; owner_epoch: number }, fromNodeId: string, epoch: number) {
    const claimed = await this.deps.db.q
      .updateTable('sessions')
      .set({ owner_epoch: epoch })
      .where('id', '=', row.id)
      .where('runtime_id', '=', fromNodeId)
      .where('owner_epoch', '=', Number(row.owner_epoch))
      .where('status', '!=', 'deleted')
      .executeTakeFirst()
    return Number(claimed.numUpdatedRows) === 1
  }

  /**
   * Another replica claimed the session first: waits (up to `RECOVERY_WAIT_MS`) until it is no
   * longer the lost node's, so the caller's next call goes to where that replica put it. Should
   * that replica die mid-way, the wait ends and the next call claims it again (a newer epoch).
   */
  private async awaitOther(sessionId: string, fromNodeId: string): Promise<undefined> {
    const deadline = Date.now() + RECOVERY_WAIT_MS
    while (Date.now() < deadline) {
      const now = await this.deps.db.q
        .selectFrom('sessions')
        .select(['runtime_id', 'status'])
        .where('id', '=', sessionId)
        .executeTakeFirst()
      if (!now || now.status === 'deleted' || now.runtime_id !== fromNodeId) return undefined
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
    return undefined
  }

  private commit(
    row: { id: string; status: string; owner_epoch: number; runtime_id: string | null; generation: number },
    from: NodeRow,
    target: NodeRow,
    epoch: number,
    restore: BucketRestore,
  ): Promise<Recovered | undefined> {
    const { db } = this.deps
    return db.transaction(async () => {
      const at = await dbNow(db)
      const locked = await db.q
        .selectFrom('sessions')
        .select(['status', 'generation'])
        .where('id', '=', row.id)
        .where('runtime_id', '=', from.id)
        .where('owner_epoch', '=', epoch)
        .forUpdate()
        .executeTakeFirst()
      if (!locked || locked.status === 'deleted') return undefined
      const snapshot = await db.q
        .selectFrom('snapshots')
        .select(['turn_seq', 'through_turn_seq'])
        .where('id', '=', restore.snapshotId)
        .executeTakeFirst()
      const throughSeq = snapshot ? Number(snapshot.through_turn_seq ?? snapshot.turn_seq) : -1
      const lost = await db.q
        .selectFrom('turns')
        .select(['id', 'seq', 'status'])
        .where('session_id', '=', row.id)
        .where('seq', '>', throughSeq)
        .orderBy('seq')
        .execute()
      const lostTurns = lost.map((t) => ({ turnId: t.id, seq: Number(t.seq), status: t.status }))
      const detail = describeRecovery(
        from.id,
        target.id,
        restore,
        throughSeq,
        lostTurns,
        Number(locked.generation),
      )
      await db.q
        .updateTable('sessions')
        .set({
          runtime_id: target.id,
          owner_epoch: epoch,
          generation: restore.generation,
          status_cause: 'node_recovered',
          shipped_generation: restore.generation,
          shipped_snapshot_id: restore.snapshotId,
          shipped_at: restore.shippedAt,
          shipped_link_seq: restore.seq,
          shipped_tree_digest: restore.treeDigest,
          updated_at: at,
        })
        .where('id', '=', row.id)
        .execute()
      await db.q
        .insertInto('session_events')
        .values({
          id: newId('event'),
          session_id: row.id,
          from_status: locked.status,
          to_status: locked.status,
          cause: 'node_recovered',
          detail,
          at,
        })
        .execute()
      await this.deps.faultAt?.('committing', row.id)
      return {
        sessionId: row.id,
        fromNodeId: from.id,
        toNodeId: target.id,
        ownerEpoch: epoch,
        restore,
        lostTurns,
        detail,
      }
    })
  }
}

/**
 * The event's words: where from, which snapshot, every turn whose changes did not make it, and the
 * changes made outside turns (a file written or deleted through the API, an import) that did not:
 * every acknowledged change moved the workspace's generation on, so a generation recorded past the
 * restored one is changes lost; with no turn lost they were all made outside turns.
 */
export function describeRecovery(
  fromNodeId: string,
  toNodeId: string,
  restore: BucketRestore,
  throughSeq: number,
  lostTurns: readonly { turnId: string; seq: number }[],
  recordedGeneration: number,
): string {
  const base =
    `restored on node ${toNodeId} after node ${fromNodeId} was lost, from snapshot ${restore.snapshotId} ` +
    `(workspace generation ${restore.generation}, ` +
    (throughSeq >= 0 ? `through turn ${throughSeq}, ` : '') +
    `shipped ${restore.shippedAt})`
  const behind = recordedGeneration - restore.generation
  if (lostTurns.length === 0) {
    if (behind <= 0) return `${base}; no turn's changes were lost`
    return `${base}; no turn's changes were lost, but ${behind} change(s) made to the workspace outside turns after it (files written or deleted through the API, an import) did not make it (the workspace had reached generation ${recordedGeneration})`
  }
  const named = lostTurns.map((t) => `turn ${t.seq} (${t.turnId})`).join(', ')
  const outside =
    behind > 0
      ? `; nor did any change made outside turns after the snapshot (files written or deleted through the API, an import: the workspace had reached generation ${recordedGeneration})`
      : ''
  return `${base}; the workspace changes of ${named} did not make it (their transcript is kept)${outside}`
}
