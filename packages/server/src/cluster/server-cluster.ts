import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { ResolvedConfig } from '../config.js'
import type { Db } from '../db/database.js'
import type { SessionService } from '../sessions/session-service.js'
import { type ClusterControl, startClusterControl } from './cluster-control.js'
import type { ClusterHints } from './cluster-hints.js'
import { DrainMoves } from './moves/drain-moves.js'
import { SessionMover } from './moves/session-mover.js'
import type { ReplicaTurns } from './replica-turns.js'
import { ClusterRuntimePort } from './routing/cluster-runtime-port.js'

/** How often a cluster's leader looks for sessions past their idle timeout or deadline (`--role api`). */
const SWEEP_MS = 1000

/** A server's part in a cluster (see `startServerCluster`). */
export interface ServerCluster {
  /** The control plane's leader election, nodes and hints (PostgreSQL only). */
  cluster: ClusterControl | undefined
  /** An API replica's session moves between nodes (`POST /v1/sessions/{id}/move`). */
  mover: SessionMover | undefined
  /** Its leader's pass emptying draining nodes by moving their idle sessions. */
  drainMoves: DrainMoves | undefined
}

/**
 * On PostgreSQL the server is part of a cluster's control plane: a candidate for leader (node
 * failure handling), the nodes' routes and figures. The reaper's passes stay with each replica
 * of a single-server role: they act on the sessions of its own runtime. An API replica moves
 * sessions between nodes; its leader empties draining nodes by moving their idle sessions, reaps
 * every node's sessions and runs the housekeeping.
 */
export function startServerCluster(options: {
  api: boolean
  config: ResolvedConfig
  db: Db
  hints: ClusterHints | undefined
  logger: Logger
  runtimePort: RuntimePort
  sessions: SessionService
  relays: ReplicaTurns | undefined
  housekeeping: () => Promise<void>
}): ServerCluster {
  const { api, config, db, hints, logger, runtimePort, sessions, relays, housekeeping } = options
  const mover =
    runtimePort instanceof ClusterRuntimePort
      ? new SessionMover({
          db,
          cluster: runtimePort,
          sessions,
          logger: logger.child({ component: 'moves' }),
        })
      : undefined
  const drainMoves = mover
    ? new DrainMoves({ db, mover, logger: logger.child({ component: 'drain' }) })
    : undefined
  const cluster =
    hints && config.databaseUrl
      ? startClusterControl({
          db,
          databaseUrl: config.databaseUrl,
          hints,
          heartbeatMs: config.heartbeatMs,
          leaseMs: config.leaseMs,
          logger,
          // `--recover-lost eager`: the leader brings a lost node's sessions back at once.
          onNodeLost:
            api && config.recoverLost === 'eager' && runtimePort instanceof ClusterRuntimePort
              ? (lost) => {
                  void runtimePort.recovery
                    .recoverNode(lost.nodeId)
                    .then((done) =>
                      logger.info({ node: lost.nodeId, ...done }, 'eager recovery of a lost node'),
                    )
                }
              : undefined,
          // API replicas own no sessions of their own: their leader reaps every node's.
          passes: api
            ? [
                { name: 'session timeouts', intervalMs: SWEEP_MS, run: () => sessions.sweep() },
                { name: 'retention', intervalMs: config.reaperIntervalMs, run: housekeeping },
                ...(relays
                  ? [
                      {
                        name: 'lost replicas',
                        intervalMs: config.heartbeatMs,
                        run: () => relays.failLostRelays(),
                      },
                    ]
                  : []),
                ...(drainMoves
                  ? [{ name: 'drain moves', intervalMs: SWEEP_MS, run: () => drainMoves.pass() }]
                  : []),
              ]
            : [],
        })
      : undefined
  return { cluster, mover, drainMoves }
}
