import { newId } from '@cairn/protocol'
import type { Logger } from 'pino'
import type { Db } from '../db/database.js'
import { dbTime } from './db-time.js'
import { type EndedTurn, endRelayedTurns } from './relayed-turns.js'

export interface ReplicaLeaseOptions {
  db: Db
  /** The replica's ID (its data dir's runtime ID): the same for every process started in it. */
  replicaId: string
  heartbeatMs: number
  leaseMs: number
  logger: Logger
}

/**
 * This API replica process's liveness (`replicas` row, migration 27): a lease on the database's
 * clock, renewed every heartbeat, which every turn the process begins names (`turns.relay_id`).
 * Once it ends (the process killed, partitioned, stopped), the leader ends those turns
 * `replica_lost`; a new process in the same data dir ends them at its start.
 */
export class ReplicaLease {
  /** This process's relay ID (`rpl_…`). */
  readonly id = newId('replica')
  private timer: NodeJS.Timeout | undefined
  private renewing: Promise<void> | undefined
  private stopped = false

  constructor(private readonly options: ReplicaLeaseOptions) {}

  get leaseMs(): number {
    return this.options.leaseMs
  }

  /**
   * Takes the lease and ends what this replica's earlier processes left running (they are gone:
   * one data dir, one process), answering those turns (their nodes are to be told).
   */
  async start(): Promise<EndedTurn[]> {
    const { db, replicaId, leaseMs } = this.options
    const ended = await db.transaction(async () => {
      await db.q
        .insertInto('replicas')
        .values({ id: this.id, replica_id: replicaId, started_at: dbTime(), lease_until: dbTime(leaseMs) })
        .execute()
      const turns = await endRelayedTurns(
        db,
        { predecessorsOf: replicaId, self: this.id },
        { code: 'replica_lost', reason: `replica ${replicaId} started again` },
      )
      await db.q
        .updateTable('replicas')
        .set({ lease_until: dbTime(), stopped_at: dbTime() })
        .where('replica_id', '=', replicaId)
        .where('id', '!=', this.id)
        .where('stopped_at', 'is', null)
        .execute()
      return turns
    })
    this.schedule()
    return ended
  }

  private schedule(): void {
    if (this.stopped) return
    this.timer = setTimeout(() => {
      this.renewing = this.renew()
        .catch((error: unknown) =>
          this.options.logger.warn({ err: error, relay: this.id }, 'renewing the replica lease failed'),
        )
        .finally(() => {
          this.renewing = undefined
          this.schedule()
        })
    }, this.options.heartbeatMs)
    this.timer.unref()
  }

  /** Extends the lease; one that lapsed (turns it relayed may have been ended) is taken again. */
  private async renew(): Promise<void> {
    const { db, leaseMs } = this.options
    const renewed = await db.q
      .updateTable('replicas')
      .set({ lease_until: dbTime(leaseMs) })
      .where('id', '=', this.id)
      .where('stopped_at', 'is', null)
      .where('lease_until', '>=', dbTime())
      .executeTakeFirst()
    if (renewed.numUpdatedRows > 0n || this.stopped) return
    this.options.logger.warn(
      { relay: this.id, leaseMs },
      "this replica's lease lapsed: turns it relayed may have been ended (replica_lost); taking a new one",
    )
    const taken = await db.q
      .updateTable('replicas')
      .set({ lease_until: dbTime(leaseMs), stopped_at: null })
      .where('id', '=', this.id)
      .executeTakeFirst()
    if (taken.numUpdatedRows === 0n)
      await db.q
        .insertInto('replicas')
        .values({
          id: this.id,
          replica_id: this.options.replicaId,
          started_at: dbTime(),
          lease_until: dbTime(leaseMs),
        })
        .execute()
  }

  /** Ends the lease: whatever this process still relays is then the leader's to end. */
  async stop(): Promise<void> {
    this.stopped = true
    if (this.timer) clearTimeout(this.timer)
    await this.renewing
    await this.options.db.q
      .updateTable('replicas')
      .set({ lease_until: dbTime(), stopped_at: dbTime() })
      .where('id', '=', this.id)
      .execute()
      .catch((error: unknown) =>
        this.options.logger.warn({ err: error, relay: this.id }, 'ending the replica lease failed'),
      )
  }
}
