import type { Logger } from 'pino'
import type { Db } from '../db/database.js'
import type { ClusterHint } from './cluster-hints.js'
import { DedicatedConnection, LEADER_LOCK_CLASS, NODE_LOCK_CLASS } from './dedicated-connection.js'
import { declareNodeLost, type NodeLost } from './node-failures.js'
import { NodeStore } from './node-store.js'

/** Work only the leader does, every `intervalMs` (the reaper's sweeps, retention). */
export interface LeaderPass {
  name: string
  intervalMs: number
  run: () => Promise<unknown>
}

export interface ClusterLeaderOptions {
  db: Db
  /** The database URL: the leader's dedicated connection (its lock, its probes of node locks). */
  databaseUrl: string
  /** How often the leader looks at the nodes (and a follower tries to become leader). */
  checkMs?: number
  /** The nodes' lease: after becoming leader, free node locks count as crashed only after it. */
  leaseMs?: number
  passes?: LeaderPass[]
  logger: Logger
  publish?: (hint: ClusterHint) => Promise<void>
  /** Told of each node declared lost. */
  onNodeLost?: (lost: NodeLost) => void
}

/**
 * One leader per cluster: whoever holds the leader advisory lock on a connection of its own (tried
 * again every `checkMs` by the others; the lock moves when its holder's connection dies). The
 * leader runs the passes that must run once in the cluster and handles node failures: a node whose
 * lease ended, or whose liveness lock is free while its row says it holds a lease (its process or
 * its connection died), is declared lost (`declareNodeLost`).
 */
export class ClusterLeader {
  private readonly connection: DedicatedConnection
  private readonly store: NodeStore
  private readonly checkMs: number
  private readonly leaseMs: number
  private leaderSince: number | undefined
  private readonly lastRun = new Map<string, number>()
  private timer: NodeJS.Timeout | undefined
  private ticking: Promise<void> | undefined
  private stopped = false

  constructor(private readonly options: ClusterLeaderOptions) {
    this.checkMs = options.checkMs ?? 1000
    this.leaseMs = options.leaseMs ?? 5000
    this.connection = new DedicatedConnection(options.databaseUrl, {
      connectTimeoutMs: Math.max(1000, this.checkMs * 2),
      queryTimeoutMs: Math.max(1000, this.checkMs * 2),
    })
    this.connection.onLost(() => {
      if (this.leaderSince !== undefined)
        options.logger.warn('cluster leader lost its connection (and the lead)')
      this.leaderSince = undefined
    })
    this.store = new NodeStore(options.db)
  }

  get isLeader(): boolean {
    return this.leaderSince !== undefined && this.connection.connected
  }

  start(): void {
    this.schedule(0)
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return
    this.timer = setTimeout(() => {
      this.ticking = this.tick().finally(() => {
        this.ticking = undefined
        this.schedule(this.checkMs)
      })
    }, delayMs)
    this.timer.unref()
  }

  /** One round: take the lead if free; as leader, handle node failures and run the passes due. */
  async tick(): Promise<void> {
    try {
      if (!this.isLeader) {
        const [row] = await this.connection.query<{ locked: boolean }>(
          'SELECT pg_try_advisory_lock($1, 0) AS locked',
          [LEADER_LOCK_CLASS],
        )
        if (!row?.locked) return
        this.leaderSince = performance.now()
        this.lastRun.clear()
        this.options.logger.info('this process leads the cluster')
      }
      await this.checkNodes()
      for (const pass of this.options.passes ?? []) {
        const last = this.lastRun.get(pass.name) ?? Number.NEGATIVE_INFINITY
        if (performance.now() - last < pass.intervalMs) continue
        this.lastRun.set(pass.name, performance.now())
        await pass
          .run()
          .catch((error: unknown) =>
            this.options.logger.error({ err: error, pass: pass.name }, 'a leader pass failed'),
          )
      }
    } catch (error) {
      if (!this.stopped) this.options.logger.warn({ err: error }, 'cluster leader round failed')
    }
  }

  /** Declares lost the nodes whose lease ended or whose process is gone. */
  private async checkNodes(): Promise<NodeLost[]> {
    const lost: NodeLost[] = []
    // Just after taking the lead (a restarted database, say) every node is reconnecting, and every
    // lease ran out while nobody could renew: a free lock or an ended lease counts only once the
    // nodes had a lease's time to take their locks again and renew (or register again). Judged at
    // once, a PostgreSQL restart longer than a lease declared every live node lost, and the next
    // request to each of their sessions brought it back from the bucket, without what was not
    // shipped yet (the cluster model test, seed 654197258).
    if (this.leaderSince === undefined || performance.now() - this.leaderSince < this.leaseMs) return lost
    for (const node of await this.store.leased()) {
      let reason: string | undefined
      if (node.expired) reason = 'its lease ended'
      else if (await this.lockFree(node.id)) reason = 'its process or connection is gone'
      if (!reason) continue
      const declared = await declareNodeLost(
        this.options.db,
        node.id,
        node.epoch,
        reason,
        this.options.publish,
      )
      if (!declared) continue
      this.options.logger.warn(
        {
          node: node.id,
          epoch: node.epoch,
          reason,
          sessions: declared.sessions,
          turns: declared.turns.length,
        },
        'node declared lost',
      )
      this.options.onNodeLost?.(declared)
      lost.push(declared)
    }
    return lost
  }

  /** Whether nobody holds the node's liveness lock (taken and let go at once if so). */
  private async lockFree(nodeId: string): Promise<boolean> {
    const [row] = await this.connection.query<{ locked: boolean }>(
      'SELECT pg_try_advisory_lock($1, hashtext($2)) AS locked',
      [NODE_LOCK_CLASS, nodeId],
    )
    if (!row?.locked) return false
    await this.connection.query('SELECT pg_advisory_unlock($1, hashtext($2))', [NODE_LOCK_CLASS, nodeId])
    return true
  }

  async stop(): Promise<void> {
    this.stopped = true
    if (this.timer) clearTimeout(this.timer)
    await this.ticking
    this.leaderSince = undefined
    await this.connection.close()
  }
}
