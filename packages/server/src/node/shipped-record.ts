import type { ConfirmedShip } from '@cairn/runtime/port'
import { sql } from 'kysely'
import type { Logger } from 'pino'
import type { Db } from '../db/database.js'

/**
 * Records a chain link the bucket confirmed as the session's newest shipped snapshot — only while
 * this node still owns the session at the owner epoch the snapshot was taken under (the cluster's
 * rule: every write a node makes carries the epoch; a stale node's write changes nothing), and
 * never backwards. Resolves to whether the row changed.
 */
export async function recordShipped(db: Db, nodeId: string, ship: ConfirmedShip): Promise<boolean> {
  let query = db.q
    .updateTable('sessions')
    .set({
      shipped_generation: ship.generation,
      shipped_snapshot_id: ship.snapshotId,
      shipped_at: ship.shippedAt,
      shipped_link_seq: ship.seq,
      shipped_tree_digest: ship.treeDigest,
    })
    .where('id', '=', ship.sessionId)
    .where('runtime_id', '=', nodeId)
    .where((eb) =>
      eb.or([eb('shipped_generation', 'is', null), eb('shipped_generation', '<=', ship.generation)]),
    )
  // Called without an epoch only in a single process (role all), which owns all its sessions.
  if (ship.ownerEpoch !== undefined) query = query.where('owner_epoch', '=', ship.ownerEpoch)
  const result = await query.executeTakeFirst()
  return Number(result.numUpdatedRows) > 0
}

/**
 * A cluster node's `recordShipped`: through the function its role may call, which checks in the
 * database what the node could leave out (node-role.ts): the session is its role's node's, at that
 * owner epoch, and the node is not declared lost nor past its lease.
 */
export async function recordShippedAsNode(db: Db, _nodeId: string, ship: ConfirmedShip): Promise<boolean> {
  const { rows } = await sql<{
    recorded: boolean
  }>`SELECT cairn_node_record_shipped(${ship.sessionId}, ${ship.ownerEpoch ?? null}::bigint, ${ship.generation}::bigint, ${ship.snapshotId}, ${ship.shippedAt}, ${ship.seq}::bigint, ${ship.treeDigest}) AS recorded`.execute(
    db.q,
  )
  return rows[0]?.recorded === true
}

type Recorder = (db: Db, nodeId: string, ship: ConfirmedShip) => Promise<boolean>

/** `recordShipped` for the port's `confirmed` hook: never throws, logs what it did not record. */
export function shippedRecorder(
  db: Db,
  nodeId: () => string | undefined,
  logger: Logger,
  record: Recorder = recordShipped,
) {
  return (ship: ConfirmedShip): void => {
    const id = nodeId()
    if (!id) return
    record(db, id, ship).then(
      (written) => {
        if (!written)
          logger.info(
            { session: ship.sessionId, snapshot: ship.snapshotId, ownerEpoch: ship.ownerEpoch },
            'shipped snapshot not recorded: the session is no longer this node’s at that epoch',
          )
      },
      (error: unknown) =>
        logger.warn({ err: error, session: ship.sessionId }, 'recording a shipped snapshot failed'),
    )
  }
}

/** Whether the node owns the session at that epoch (shipping's check before a chain link). */
export async function ownsSession(
  db: Db,
  nodeId: string,
  sessionId: string,
  ownerEpoch: number | undefined,
): Promise<boolean> {
  let query = db.q
    .selectFrom('sessions')
    .select('id')
    .where('id', '=', sessionId)
    .where('runtime_id', '=', nodeId)
  if (ownerEpoch !== undefined) query = query.where('owner_epoch', '=', ownerEpoch)
  return (await query.executeTakeFirst()) !== undefined
}

/**
 * The node's shipping hooks: links only for sessions it owns, each recorded against its epoch
 * (`record`: `recordShippedAsNode` on a cluster node, whose role may not write the table).
 */
export function nodeShippingHooks(
  db: Db,
  nodeId: () => string | undefined,
  logger: Logger,
  record: Recorder = recordShipped,
) {
  return {
    confirmed: shippedRecorder(db, nodeId, logger, record),
    owns: async (sessionId: string, ownerEpoch: number | undefined) => {
      const id = nodeId()
      return id !== undefined && (await ownsSession(db, id, sessionId, ownerEpoch))
    },
  }
}
