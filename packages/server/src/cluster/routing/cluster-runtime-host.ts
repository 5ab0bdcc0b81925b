import { CairnProblem } from '@cairn/protocol'
import type { RuntimeEvents } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { ResolvedConfig } from '../../config.js'
import type { Db } from '../../db/database.js'
import type { RuntimeHost } from '../../runtime-host/runtime-host.js'
import { ClusterRuntimePort } from './cluster-runtime-port.js'
import type { ClusterRuntimePortOptions } from './cluster-runtime-port-options.js'
import { type ConnectNode, DatabaseNodeDirectory, type NodeRow } from './node-directory.js'

/** How an API replica reaches a node: its port from the node's row, its events to `events`. */
export type NodeConnector = (row: NodeRow, events: RuntimeEvents) => ReturnType<ConnectNode>

/**
 * `--role api`: no runtime here; the port routes every call to a node of the cluster (see
 * `ClusterRuntimePort`). Needs PostgreSQL (the nodes and the sessions' owners are there).
 */
export async function openClusterRuntime(options: {
  config: ResolvedConfig
  db: Db
  logger: Logger
  events: RuntimeEvents
  /** The API replica's own ID (no session is ever recorded under it). */
  apiId: string
  connect: NodeConnector
  /** See `ClusterRuntimePortOptions.cacheMs`, `.recoveryFaultAt`. */
  cacheMs?: number | undefined
  recoveryFaultAt?: ClusterRuntimePortOptions['recoveryFaultAt']
}): Promise<RuntimeHost> {
  const { db, logger, events } = options
  if (db.dialect !== 'postgres')
    throw new CairnProblem(
      'validation_failed',
      '--role api needs --database postgres://… (the cluster lives in PostgreSQL)',
    )
  const directory = new DatabaseNodeDirectory(db, (row) => options.connect(row, events))
  const port = new ClusterRuntimePort({
    db,
    directory,
    cacheMs: options.cacheMs,
    recoveryFaultAt: options.recoveryFaultAt,
    logger: logger.child({ component: 'routing' }),
    recoverLost: options.config.recoverLost,
    leaseMs: options.config.leaseMs,
  })
  // What workspace manifests name: a serving node's drivers, else the cluster's defaults.
  const described = await port.describe().catch(() => undefined)
  return {
    port,
    runtimeId: options.apiId,
    drivers: {
      isolation: described?.isolation.name ?? 'bwrap',
      storage: described?.storage.driver ?? 'btrfs',
    },
    reserveBytes: undefined,
    routing: port,
    describe: () => ({ role: 'api', nodes: 'routed (see GET /v1/runtime)' }),
    close: () => directory.close(),
  }
}
