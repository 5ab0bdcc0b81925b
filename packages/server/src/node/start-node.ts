import os from 'node:os'
import { CairnProblem } from '@cairn/protocol'
import {
  loadClusterTls,
  RuntimeEventHub,
  type RuntimePort,
  type ServedRuntimePort,
  serveRuntimePort,
} from '@cairn/runtime/port'
import pino, { type Logger } from 'pino'
import { systemClock } from '../clock.js'
import { NodeRegistry } from '../cluster/node-registry.js'
import type { NodeFigures } from '../cluster/node-store.js'
import { resolveConfig, type ServerOptions } from '../config.js'
import { type Db, openDatabase } from '../db/database.js'
import { reservePort } from '../http/port-reservation.js'
import { checkRuntimeHost, claimDataDir, openLocalRuntime, syncSharedFiles } from '../local-runtime.js'
import type { RuntimeHost } from '../runtime-host/runtime-host.js'
import { reportFencedTurns } from './fenced-turns.js'
import { nodeShippingHooks, recordShippedAsNode } from './shipped-record.js'

/** `cairn node`: the runtime flags `cairn server` has, and where the node meets its cluster. */
export interface NodeOptions
  extends Pick<
    ServerOptions,
    | 'dataDir'
    | 'storage'
    | 'poolPath'
    | 'poolImageSizeBytes'
    | 'logLevel'
    | 'clock'
    | 'workspaceQuotaMiB'
    | 'tenantQuotaMiB'
    | 'poolReserveMiB'
    | 'imagesQuotaMiB'
    | 'egressPrivateExceptions'
    | 'egressHosts'
    | 'egressLimits'
    | 'maxImageMiB'
    | 'isolation'
    | 'gvisorPoolSize'
    | 'spareLaunchers'
    | 'residentPauses'
    | 'residentPauseMs'
    | 'runBase'
    | 'heartbeatMs'
    | 'leaseMs'
    | 's3Bucket'
    | 's3Endpoint'
    | 's3Prefix'
  > {
  /** The cluster's PostgreSQL (env `CAIRN_DATABASE_URL`); required: a node has no database of its own. */
  database?: string | undefined
  /** The certificates `cairn cluster init` wrote (env `CAIRN_CLUSTER_DIR`). */
  clusterDir?: string | undefined
  /** `HOST:PORT` the runtime port listens on (env `CAIRN_NODE_LISTEN`; port 0: any). */
  listen?: string | undefined
  /** Where API replicas reach it (env `CAIRN_NODE_ADVERTISE`; default `https://<listen host>:<port>`). */
  advertise?: string | undefined
  /** The node's name in `cairn nodes list` (default the host name). */
  name?: string | undefined
}

export interface RunningNode {
  /** The node's ID: its runtime ID (`<data-dir>/runtime-id`). */
  nodeId: string
  /** Where its runtime port listens. */
  url: string
  /** What it registered as its address. */
  address: string
  dataDir: string
  registry: NodeRegistry
  /** The runtime's port (the local one, as served). */
  port: RuntimePort
  logger: Logger
  close(): Promise<void>
}

export const DEFAULT_NODE_LISTEN = '127.0.0.1:7443'

/** `HOST:PORT` or `[v6]:PORT`. */
export function parseListen(value: string): { host: string; port: number } {
  const match = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(value)
  const port = Number(match?.[3])
  if (!match || port > 65535)
    throw new CairnProblem(
      'validation_failed',
      `--listen (CAIRN_NODE_LISTEN) must be HOST:PORT, not '${value}'`,
    )
  return { host: (match[1] ?? match[2]) as string, port }
}

function urlHost(host: string): string {
  return host.includes(':') ? `[${host}]` : host
}

/**
 * Starts a runtime node: this machine's runtime (as `cairn server` opens it), its port served to
 * the cluster's API replicas over mutual TLS, registered in the cluster's PostgreSQL with a lease
 * it renews, fenced (every sandbox stopped, every call refused) when it cannot renew. A node
 * needs PostgreSQL: the cluster's nodes, leases and owner epochs live there.
 */
export async function startNode(options: NodeOptions = {}): Promise<RunningNode> {
  const databaseUrl = options.database ?? process.env.CAIRN_DATABASE_URL
  if (!databaseUrl)
    throw new CairnProblem(
      'validation_failed',
      "cairn node needs the cluster's PostgreSQL (--database postgres://… or CAIRN_DATABASE_URL): a node keeps no database of its own, and SQLite cannot be shared",
      { option: 'database' },
    )
  const config = resolveConfig({ ...options, database: databaseUrl, port: 0 })
  const clusterDir = options.clusterDir ?? process.env.CAIRN_CLUSTER_DIR
  if (!clusterDir)
    throw new CairnProblem(
      'validation_failed',
      'cairn node needs the cluster certificates (--cluster-dir DIR or CAIRN_CLUSTER_DIR; see cairn cluster init)',
      { option: 'cluster-dir' },
    )
  const listen = parseListen(options.listen ?? process.env.CAIRN_NODE_LISTEN ?? DEFAULT_NODE_LISTEN)
  const advertised = options.advertise ?? process.env.CAIRN_NODE_ADVERTISE
  const tls = await loadClusterTls(clusterDir, 'node')
  const clock = options.clock ?? systemClock
  const logger = pino({ level: config.logLevel, base: { service: 'cairn-node' } })
  // What this host lacks first, then the port: either fails the start before the data dir,
  // database or pool are touched.
  await checkRuntimeHost(config, logger)
  const reserved = await reservePort(listen.port, listen.host, '--listen')
  const dataDir = await claimDataDir(config, logger).catch(async (error: unknown) => {
    await reserved.release()
    throw error
  })
  let db: Db
  try {
    // A node may not change the schema (its role cannot): an API replica migrates it first.
    db = await openDatabase(databaseUrl, { migrate: false })
  } catch (error) {
    await reserved.release()
    await dataDir.releaseLocks()
    throw error
  }
  let host: RuntimeHost | undefined
  let served: ServedRuntimePort | undefined
  let registry: NodeRegistry | undefined
  try {
    // Sandboxes trust one egress CA wherever they run: the cluster's, from the database (through
    // the view a node's role may read: the secrets key is not in it; secrets come per sandbox
    // from the API replica over the runtime port).
    await syncSharedFiles(db, config.dataDir, clock, { secretKey: false, node: true })
    const events = new RuntimeEventHub()
    let opened: string | undefined
    host = await openLocalRuntime(config, dataDir, {
      clock,
      logger,
      events,
      // A link the bucket confirmed is recorded against the epoch its snapshot was taken under.
      shipping: nodeShippingHooks(
        db,
        () => opened,
        logger.child({ component: 'shipping' }),
        recordShippedAsNode,
      ),
    })
    const nodeId = host.runtimeId
    opened = nodeId
    const port = host.port
    const figures = async (): Promise<NodeFigures> => {
      const [description, warm, stats] = await Promise.all([
        port.describe(),
        port.warmCount(),
        port.poolStats().catch(() => undefined),
      ])
      return {
        drivers: description.drivers.filter((d) => d.available).map((d) => d.name),
        cpus: os.availableParallelism(),
        warmSandboxes: warm,
        poolFreeBytes: stats?.freeBytes,
        poolSizeBytes: stats?.totalBytes,
      }
    }
    // Served before it registers (so its address answers once the cluster sees it), and fenced
    // until then: every call is refused while the registry says so.
    // A turn its own fence cut says so (node_fenced), not that the agent crashed.
    await reserved.release()
    served = await serveRuntimePort(
      reportFencedTurns(port, () => registry?.fence.generation ?? 0),
      {
        host: listen.host,
        port: listen.port,
        tls,
        events,
        isFenced: () => registry?.isFenced() ?? true,
        // The node keeps the epochs it saw in memory: after a restart, the database's stand.
        epochFloor: (sessionId) => sessionEpoch(db, sessionId),
      },
    )
    const boundPort = Number(new URL(served.url).port)
    const address = advertised ?? `https://${urlHost(listen.host)}:${boundPort}`
    registry = new NodeRegistry({
      db,
      databaseUrl,
      nodeId,
      name: options.name ?? os.hostname(),
      address,
      figures,
      stopAllAgents: () => port.stopAllAgents(),
      heartbeatMs: config.heartbeatMs,
      leaseMs: config.leaseMs,
      logger: logger.child({ component: 'node-registry' }),
    })
    const epoch = await registry.start()
    logger.info(
      {
        nodeId,
        address,
        listen: served.url,
        epoch,
        dataDir: config.dataDir,
        ...host.describe(),
      },
      'cairn node serving its runtime',
    )
    const registered = registry
    const servedPort = served
    const runtime = host
    let closing: Promise<void> | undefined
    return {
      nodeId,
      url: served.url,
      address,
      dataDir: config.dataDir,
      registry: registered,
      port,
      logger,
      close() {
        closing ??= (async () => {
          // Out of the cluster first (state stopped: nothing is routed here any more), then the
          // port, the sandboxes and the pool.
          await registered.stop()
          await servedPort.close()
          await runtime.close()
          await db.close()
          await dataDir.releaseLocks()
          logger.info('cairn node stopped')
        })()
        return closing
      },
    }
  } catch (error) {
    await registry?.stop().catch(() => {})
    await served?.close().catch(() => {})
    await host
      ?.close()
      .catch((closeError: unknown) =>
        logger.error({ err: closeError }, 'closing the runtime after a failed start failed'),
      )
    await db.close()
    await reserved.release()
    await dataDir.releaseLocks()
    throw error
  }
}

/** The session's owner epoch in the database (undefined: no row yet); the database unreachable is `unavailable`. */
async function sessionEpoch(db: Db, sessionId: string): Promise<number | undefined> {
  const row = await db.q
    .selectFrom('sessions')
    .select('owner_epoch')
    .where('id', '=', sessionId)
    .executeTakeFirst()
    .catch((error: unknown) => {
      throw new CairnProblem(
        'unavailable',
        `the owner epoch of session ${sessionId} could not be read: ${error instanceof Error ? error.message : String(error)}`,
      )
    })
  return row === undefined ? undefined : Number(row.owner_epoch)
}
