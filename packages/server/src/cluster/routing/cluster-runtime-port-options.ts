import type { Logger } from 'pino'
import type { Db } from '../../db/database.js'
import type { NodeDirectory } from './node-directory.js'

export interface ClusterRuntimePortOptions {
  db: Db
  directory: NodeDirectory
  logger: Logger
  /** How long a session's node and epoch, a revision's holders and the nodes' rows are reused. */
  cacheMs?: number | undefined
  /** Free pool space a node needs to take a new session (default 64 MiB). */
  minFreeBytes?: number | undefined
  /** Placement's random source (tests seed it). */
  random?: (() => number) | undefined
  now?: (() => number) | undefined
  /**
   * Whether a session of a lost node is recovered from the shipping bucket on its next use
   * (default) or not at all (`never`: it waits for its node, `node_lost`). `eager` recovery is
   * the leader's (`recoverNode`), on top of the on-use one.
   */
  recoverLost?: 'on-message' | 'eager' | 'never' | undefined
  /** The nodes' lease (default 5000): how soon the leader declares a dead node lost. */
  leaseMs?: number | undefined
  /** Fault injection into node-loss recovery (tests; see `NodeLossRecoveryDeps.faultAt`). */
  recoveryFaultAt?: RecoveryFaultAt | undefined
}

/** The steps of a node-loss recovery a fault can be injected after (see `NodeLossRecoveryDeps.faultAt`). */
export type RecoveryStep = 'claimed' | 'restored' | 'committing'
export type RecoveryFaultAt = (step: RecoveryStep, sessionId: string) => Promise<void>
