import type { Logger } from 'pino'
import type { Db } from '../db/database.js'
import type { ClusterHint, ClusterHints } from './cluster-hints.js'
import { ClusterLeader, type LeaderPass } from './cluster-leader.js'
import type { NodeLost } from './node-failures.js'
import { NodeStore } from './node-store.js'

/** What an API process (role all or api) on PostgreSQL runs of the cluster's control plane. */
export interface ClusterControl {
  nodes: NodeStore
  hints: ClusterHints
  leader: ClusterLeader
  publish: (hint: ClusterHint) => Promise<void>
  close(): Promise<void>
}

/**
 * Starts the cluster's control plane in an API process: the nodes' table, the hints, and a
 * candidate for leader (the one that takes the lead handles node failures and runs `passes`).
 */
export function startClusterControl(options: {
  db: Db
  databaseUrl: string
  /** The process's hints (its owner closes them). */
  hints: ClusterHints
  heartbeatMs: number
  leaseMs: number
  logger: Logger
  passes?: LeaderPass[]
  /** Told of each node this process, as leader, declared lost (eager recovery). */
  onNodeLost?: ((lost: NodeLost) => void) | undefined
}): ClusterControl {
  const logger = options.logger.child({ component: 'cluster' })
  const hints = options.hints
  const publish = (hint: ClusterHint) => hints.publish(hint)
  const leader = new ClusterLeader({
    db: options.db,
    databaseUrl: options.databaseUrl,
    checkMs: options.heartbeatMs,
    leaseMs: options.leaseMs,
    passes: options.passes ?? [],
    logger,
    publish,
    ...(options.onNodeLost ? { onNodeLost: options.onNodeLost } : {}),
  })
  leader.start()
  return {
    nodes: new NodeStore(options.db),
    hints,
    leader,
    publish,
    async close() {
      await leader.stop()
    },
  }
}
