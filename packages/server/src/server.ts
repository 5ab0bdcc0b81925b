import { chmod, readFile, writeFile } from 'node:fs/promises'
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import path from 'node:path'
import type { Runtime } from '@cairn/runtime'
import pino, { type Logger } from 'pino'
import { AgentService } from './agents/agent-service.js'
import { BuildLogs } from './agents/build-logs.js'
import {
  apiDataDir,
  checkApiRole,
  remoteNodeConnector,
  type StartServerExtras,
  syncSecretKey,
} from './api-role.js'
import { buildApp } from './app.js'
import { ApprovalService } from './approvals/approval-service.js'
import { ApprovalStore } from './approvals/approval-store.js'
import { ApiKeyStore, DEFAULT_TENANT_ID } from './auth/api-keys.js'
import { RateLimits } from './auth/plugin.js'
import { systemClock } from './clock.js'
import { ClusterHints } from './cluster/cluster-hints.js'
import { ReplicaLease } from './cluster/replica-lease.js'
import { ReplicaTurns } from './cluster/replica-turns.js'
import { openClusterRuntime } from './cluster/routing/cluster-runtime-host.js'
import { type ServerCluster, startServerCluster } from './cluster/server-cluster.js'
import { CommandService } from './commands/command-service.js'
import { TerminalSockets } from './commands/terminal-socket.js'
import { resolveConfig, type ServerOptions } from './config.js'
import { writeCredentialsIfMissing } from './credentials.js'
import { createOwnerOnly, runtimeIdOf } from './data-dir.js'
import { type Db, openDatabase, type StatementTap } from './db/database.js'
import { ConnectionAdmission } from './http/admission.js'
import { BodyBudget } from './http/body-budget.js'
import { reservePorts } from './http/port-reservation.js'
import type { ImageService } from './images/image-service.js'
import { ManualSnapshotCap } from './limits/snapshot-cap.js'
import { StorageBudget } from './limits/storage-budget.js'
import { TurnAdmission } from './limits/turn-admission.js'
import {
  checkRuntimeHost,
  claimDataDir,
  mebibytes,
  openLocalRuntime,
  syncSharedFiles,
} from './local-runtime.js'
import { ArtifactStore } from './memory/artifact-store.js'
import { MemoryService } from './memory/memory-service.js'
import { MetricsRegistry } from './metrics/registry.js'
import { nodeShippingHooks } from './node/shipped-record.js'
import { createPreviewListener, type PreviewListener } from './previews/preview-listener.js'
import { DEFAULT_PREVIEW_DOMAIN, PreviewOrigins } from './previews/preview-origins.js'
import { PreviewRevocations } from './previews/preview-revocations.js'
import { PreviewService } from './previews/preview-service.js'
import { PreviewSigner } from './previews/preview-signer.js'
import { RetentionService } from './retention/retention-service.js'
import { DeferredRuntimeEvents, type RuntimeHost } from './runtime-host/runtime-host.js'
import { SecretCipher } from './secrets/cipher.js'
import { SecretStore } from './secrets/secret-store.js'
import type { SessionObserver } from './sessions/session-observer.js'
import { SessionRuntimeEvents } from './sessions/session-runtime-events.js'
import { SessionService } from './sessions/session-service.js'
import { SetupService } from './setup/setup-service.js'
import { openWebhooks, type Webhooks } from './webhooks/open-webhooks.js'
import { WorkspaceService } from './workspace/workspace-service.js'

export type { StartServerExtras } from './api-role.js'

export const SERVER_VERSION = '0.1.0'

const LOOPBACK_HOSTS = new Set(['127.0.0.1', '::1', 'localhost'])

export interface RunningServer {
  url: string
  port: number
  /** The preview listener's port; previews are at http://<port>-ses-<id>.<previewDomain>:<previewPort>/. */
  previewPort: number
  previewDomain: string
  dataDir: string
  adminKeyPath: string
  /** Set when this start created the admin key (first start). */
  adminKey: string | undefined
  credentialsWritten: string | undefined
  logger: Logger
  /** Built images (retention collects the unused ones at each reaper pass; tests call `collect`). */
  images: ImageService
  sessions: SessionService
  retention: RetentionService
  /** Every statement this server sends its database (benches and tests count a turn's). */
  statements: StatementTap
  /** The runtime in this process; a `role: 'api'` server has none (reading this throws). */
  readonly runtime: Runtime
  /** Stops: running turns get `shutdownGraceMs` to finish, then sandboxes, pool and locks go. */
  close(): Promise<void>
  /** Stops as `close` does, but cancels running turns at once (also when a `close` is under way). */
  closeNow(): Promise<void>
}

/** Kept free on the data dir's disk (database, transcripts) when the pool has no reserve of its own. */
const DATA_DISK_RESERVE_BYTES = 64 * 1024 * 1024

/**
 * Starts the control plane and what it runs sessions on: the local runtime (database, storage
 * pool, sandboxes; `role: 'all'`), or the cluster's nodes (`role: 'api'`), and the HTTP API.
 */
export async function startServer(
  options: ServerOptions = {},
  extras: StartServerExtras = {},
): Promise<RunningServer> {
  const config = resolveConfig(options)
  const api = config.role === 'api'
  if (api) checkApiRole(config, extras)
  const clock = options.clock ?? systemClock
  const logger = pino({ level: config.logLevel, base: { service: 'cairn' } })
  // What this host lacks first, then the ports: either fails the start before the data dir,
  // database or pool are touched.
  if (!api) await checkRuntimeHost(config, logger)
  const ports = await reservePorts([
    { port: config.port, host: config.host, option: '--port' },
    { port: config.previewPort, host: config.host, option: '--preview-port' },
  ])
  const dataDir = await (api ? apiDataDir(config) : claimDataDir(config, logger)).catch(
    async (error: unknown) => {
      await ports.release()
      throw error
    },
  )
  const releaseLocks = async () => {
    await ports.release()
    await dataDir.releaseLocks()
  }
  let db: Db
  try {
    if (config.databaseUrl) db = await openDatabase(config.databaseUrl)
    else {
      createOwnerOnly(path.join(config.dataDir, 'cairn.db'))
      db = await openDatabase(path.join(config.dataDir, 'cairn.db'))
    }
  } catch (error) {
    await releaseLocks()
    throw error
  }
  // What the runtime reports outside a call (pause and network events) goes to the sessions'
  // records once they exist.
  const runtimeEvents = new DeferredRuntimeEvents()
  let host: RuntimeHost | undefined
  let localRuntime: Runtime | undefined
  let previewListener: PreviewListener | undefined
  let cluster: ServerCluster['cluster']
  let lease: ReplicaLease | undefined
  let webhooks: Webhooks | undefined
  // On PostgreSQL, replicas share one database and tell each other what they must not go on
  // remembering (a revoked key, a revoked preview port) through hints.
  const hints =
    db.dialect === 'postgres' && config.databaseUrl
      ? new ClusterHints({ db, url: config.databaseUrl, logger: logger.child({ component: 'cluster' }) })
      : undefined
  try {
    if (api) {
      host = await openClusterRuntime({
        config,
        db,
        logger,
        events: runtimeEvents,
        apiId: await runtimeIdOf(config.dataDir),
        connect: extras.connectNode ?? (await remoteNodeConnector(config)),
        cacheMs: extras.routeCacheMs,
        recoveryFaultAt: extras.recoveryFaultAt,
      })
    } else {
      let ownId: string | undefined
      const local = await openLocalRuntime(config, dataDir, {
        clock,
        logger,
        events: runtimeEvents,
        // Role all with a bucket: shipped snapshots recorded as a node records them.
        shipping: nodeShippingHooks(db, () => ownId, logger.child({ component: 'shipping' })),
      })
      ownId = local.runtimeId
      localRuntime = local.runtime
      host = local
    }
    const runtimeHost = host
    const runtimePort = host.port
    const runtimeId = host.runtimeId
    const keys = new ApiKeyStore(db, clock, hints)
    await keys.ensureTenant(DEFAULT_TENANT_ID, 'default')
    // Replicas share one database: the secrets key (and, where sandboxes run, the egress CA) come
    // from it. An API replica runs no sandbox: it needs the secrets key only.
    if (db.dialect === 'postgres' && api) await syncSecretKey(db, config.dataDir, clock)
    else if (db.dialect === 'postgres') await syncSharedFiles(db, config.dataDir, clock, { secretKey: true })
    const cipher = await SecretCipher.load(path.join(config.dataDir, 'secret.key'))
    const secrets = new SecretStore(db, cipher, clock)
    webhooks = openWebhooks(config, { db, clock, logger, cipher })
    const logs = new BuildLogs(path.join(config.dataDir, 'build-logs'), db)
    const agents = new AgentService({
      db,
      runtime: runtimePort,
      secrets,
      logs,
      clock,
      logger,
      archiveLimits: { maxFiles: config.maxArchiveFiles, maxUnpackedBytes: config.maxUnpackedBytes },
      build: { buildEgressAllow: config.buildEgressAllow },
      images: {
        defaultImage: config.defaultImage,
        debianMirror: config.debianMirror,
        maxImagesPerTenant: config.maxImagesPerTenant,
      },
      operatorLimits: config.operatorLimits,
    })
    const metrics = new MetricsRegistry()
    const memory = new MemoryService({ db, runtime: runtimePort, clock, logger })
    const storageBudget = new StorageBudget({
      db,
      runtime: runtimePort,
      clock,
      tenantBytes: mebibytes(config.tenantQuotaMiB),
    })
    const turnAdmission = new TurnAdmission({ budget: storageBudget, clock })
    const artifacts = new ArtifactStore({
      db,
      runtime: runtimePort,
      clock,
      logger,
      budget: storageBudget,
      root: path.join(config.dataDir, 'artifacts'),
      diskReserveBytes: host.reserveBytes ?? DATA_DISK_RESERVE_BYTES,
    })
    const setup = new SetupService({
      db,
      runtime: runtimePort,
      agents,
      secrets,
      operatorLimits: config.operatorLimits,
      clock,
      logger,
    })
    // Told of sessions' creation, turns and deletion: the snapshot policy and the previews, added
    // below once they exist (they use the session service themselves).
    const observers: SessionObserver[] = []
    // An API replica's turns belong to this process while its lease lives (docs/cluster.md).
    lease =
      api && hints
        ? new ReplicaLease({
            db,
            replicaId: runtimeId,
            heartbeatMs: config.heartbeatMs,
            leaseMs: config.leaseMs,
            logger: logger.child({ component: 'cluster' }),
          })
        : undefined
    const relays =
      lease && hints
        ? new ReplicaTurns({
            db,
            lease,
            hints,
            runtime: runtimePort,
            logger: logger.child({ component: 'cluster' }),
          })
        : undefined
    const sessions = new SessionService({
      runtimeId,
      routing: host.routing,
      relays,
      metrics,
      memory,
      setup,
      db,
      runtime: runtimePort,
      observers,
      agents,
      secrets,
      egressUpstreamCaPems: config.egressUpstreamCaFile
        ? [await readFile(config.egressUpstreamCaFile, 'utf8')]
        : undefined,
      operatorLimits: config.operatorLimits,
      clock,
      logger,
      hints,
      storageBudget,
      turnAdmission,
    })
    runtimeEvents.target = new SessionRuntimeEvents(sessions.store, clock, logger)
    let retention: RetentionService | undefined
    const workspace = new WorkspaceService({
      db,
      runtime: runtimePort,
      runtimeDrivers: host.drivers,
      sessions,
      agents,
      clock,
      logger,
      archiveLimits: { maxFiles: config.maxArchiveFiles, maxUnpackedBytes: config.maxUnpackedBytes },
      keepAutoSnapshots: async (tenantId) => (await retention?.policy(tenantId))?.keepAutoSnapshots ?? 50,
      setupOf: (sessionId) => setup.store.info(sessionId),
      manualSnapshotCap: new ManualSnapshotCap(db, config.operatorLimits),
      storageBudget,
    })
    const retentionService = new RetentionService({
      db,
      runtime: runtimePort,
      sessions,
      workspace,
      clock,
      logger,
      memoryCheckpointTtlMs: config.memoryCheckpointTtlMs,
      images: agents.images,
      artifacts,
      buildLogs: logs,
    })
    retention = retentionService
    setup.onSucceeded(async (row) => (await workspace.snapshotAfterSetup(row)).id)
    setup.onWorkspaceWritten((sessionId) => sessions.advanceGeneration(sessionId))
    // What a crash of this process left is its own runtime's: an API replica has none (a node's
    // turns cut short are the leader's to fail).
    if (!api) {
      const recovered = await sessions.recover()
      await setup.store.recoverAfterRestart(runtimeId)
      await setup.resume.recoverAfterRestart(runtimeId)
      const reconciled = await sessions.reconcile(
        new Set((await workspace.snapshots.allLive()).map((s) => s.id)),
      )
      if (reconciled.lost.length > 0 || reconciled.orphans.length > 0) {
        logger.warn(reconciled, 'storage pool checked against the database')
      }
      const repaired = await workspace.completeInterruptedTurns(recovered.turns)
      if (recovered.sessions > 0 || recovered.turns.length > 0)
        logger.warn(
          { sessions: recovered.sessions, turns: recovered.turns.length, preTurnSnapshotsTaken: repaired },
          'marked turns interrupted by the last shutdown',
        )
    } else await relays?.start()
    const previews = new PreviewService({
      db,
      keys,
      sessions,
      signer: new PreviewSigner(cipher.deriveKey('preview-url')),
      revocations: new PreviewRevocations(db),
      runtime: runtimePort,
      clock,
      logger,
      hints,
    })
    const approvals = new ApprovalService({
      store: new ApprovalStore(db),
      sessions,
      reviewSnapshot: async (row, seq, approvalId) =>
        (await workspace.policy.take(row, 'manual', 'review', seq, `review ${approvalId}`)).id,
      clock,
      logger: logger.child({ component: 'approvals' }),
    })
    observers.push(workspace.policy, previews, approvals)
    previewListener = createPreviewListener(previews, config.previewDomain, logger)
    // One admission for both listeners: a peer's connections and the total count over the two.
    const admission = new ConnectionAdmission(config.operatorLimits)
    if (admission.maxConnections < config.operatorLimits.maxConnections)
      logger.warn(
        { asked: config.operatorLimits.maxConnections, allowed: admission.maxConnections },
        "CAIRN_MAX_CONNECTIONS is above what the descriptor limit leaves after the runtime's reserve; lowered",
      )
    admission.attach(previewListener.server, { relaysUpgrades: true })
    await ports.release()
    const previewPort = await listen(previewListener.server, config.previewPort, config.host)
    if (config.previewDomain === DEFAULT_PREVIEW_DOMAIN && !LOOPBACK_HOSTS.has(config.host)) {
      logger.warn(
        { host: config.host, previewDomain: config.previewDomain },
        'previews are served at <port>-ses-<id>.localhost, which only a browser on this machine reaches; set --preview-domain (CAIRN_PREVIEW_DOMAIN) to a domain whose subdomains resolve to this server',
      )
    }
    const housekeeping = async () => {
      await approvals.expireDue()
      await retentionService.apply()
      await agents.images.collect()
    }
    const started = startServerCluster({
      api,
      config,
      db,
      hints,
      logger,
      runtimePort,
      sessions,
      relays,
      housekeeping,
    })
    cluster = started.cluster
    const { mover, drainMoves } = started
    const commands = new CommandService({
      db,
      sessions,
      secrets,
      runtime: runtimePort,
      clock,
      logger,
      budget: storageBudget,
    })
    // One set of budgets for every way in: the routes, the compat API, terminal sockets.
    const rateLimits = new RateLimits({
      ratePerSecond: config.rateLimitPerSecond,
      tenantRatePerSecond: config.operatorLimits.tenantRateLimitPerSecond,
    })
    // One budget for what request bodies and terminal sockets' input hold, per tenant and in all.
    const bodyBudget = new BodyBudget(config.bodyBudget)
    const app = await buildApp({
      cluster: cluster ? { nodes: cluster.nodes, publish: cluster.publish, mover } : undefined,
      commands,
      db,
      logger,
      keys,
      secrets,
      workspace,
      retention: retentionService,
      metrics,
      memory,
      artifacts,
      setup,
      webhooks: webhooks.store,
      approvals,
      previews,
      previewOrigins: new PreviewOrigins(config.previewDomain, previewPort),
      runtime: runtimePort,
      agents,
      sessions,
      maxUploadBytes: config.maxUploadBytes,
      bodyBudget,
      rateLimits,
      operatorLimits: config.operatorLimits,
      sseHeartbeatMs: config.sseHeartbeatMs,
      sseStallMs: config.sseStallMs,
      version: SERVER_VERSION,
      compat: config.compatPrefix
        ? {
            prefix: config.compatPrefix,
            archiveLimits: { maxFiles: config.maxArchiveFiles, maxUnpackedBytes: config.maxUnpackedBytes },
          }
        : undefined,
    })
    // The API listener answers every Upgrade request: terminals over WebSocket, 404 for the rest.
    const terminals = new TerminalSockets({
      keys,
      commands,
      logger,
      rateLimits,
      bodyBudget,
      stallMs: config.sseStallMs,
    })
    terminals.attach(app.server)
    admission.attach(app.server, { relaysUpgrades: true })
    const address = await app.listen({ port: config.port, host: config.host })
    const port = Number(new URL(address).port)
    webhooks.listening([port, previewPort])
    const url = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`
    const adminKeyPath = path.join(config.dataDir, 'admin.key')
    let adminKey: string | undefined
    let credentialsWritten: string | undefined
    if ((await keys.count()) === 0) {
      adminKey = (await keys.create(DEFAULT_TENANT_ID, 'admin', 'admin (first start)')).key
      await writeFile(adminKeyPath, `${adminKey}\n`, { mode: 0o600 })
      await chmod(adminKeyPath, 0o600)
      if (config.writeCredentials) credentialsWritten = await writeCredentialsIfMissing(url, adminKey)
      logger.info({ adminKeyPath, credentials: credentialsWritten }, 'created the admin API key')
    }
    if (!api) sessions.startReaper(config.reaperIntervalMs, housekeeping)
    logger.info(
      {
        url,
        previews: `http://<port>-ses-<id>.${config.previewDomain}:${previewPort}`,
        dataDir: config.dataDir,
        ...host.describe(),
      },
      'cairn server listening',
    )
    let closing: Promise<void> | undefined
    const cutShort = new AbortController()
    const running: RunningServer = {
      url,
      port,
      previewPort,
      previewDomain: config.previewDomain,
      images: agents.images,
      retention: retentionService,
      dataDir: config.dataDir,
      adminKeyPath,
      adminKey,
      credentialsWritten,
      logger,
      sessions,
      statements: db.statements,
      get runtime(): Runtime {
        if (!localRuntime) throw new Error('a --role api server has no runtime of its own')
        return localRuntime
      },
      close() {
        closing ??= (async () => {
          await previewListener?.close()
          // New requests are refused from here; a stream of a running turn ends with its turn,
          // which is given the grace and then cancelled (a replica's: failed replica_stopping).
          terminals.close()
          const appClosed = app.close()
          await sessions.drain(config.shutdownGraceMs, cutShort.signal)
          await appClosed
          drainMoves?.stop()
          await drainMoves?.settle()
          await sessions.drain(config.shutdownGraceMs, cutShort.signal)
          await workspace.settle()
          commands.close()
          await sessions.close()
          // Its turns are over: their allowances are released, not left to lapse.
          await turnAdmission
            .close()
            .catch((error: unknown) => logger.warn({ err: error }, 'releasing the turn allowances failed'))
          await webhooks?.deliverer.close()
          await lease?.stop()
          await runtimeHost.close()
          await cluster?.close()
          await hints?.close()
          await db.close()
          await releaseLocks()
          logger.info('cairn server stopped')
        })()
        return closing
      },
      closeNow() {
        cutShort.abort()
        return running.close()
      },
    }
    return running
  } catch (error) {
    await previewListener?.close()
    await webhooks?.deliverer.close()
    await lease?.stop()
    await cluster?.close()
    await hints?.close()
    // The start's own error is rethrown below; a runtime that also fails to close is logged.
    await host
      ?.close()
      .catch((closeError: unknown) =>
        logger.error({ err: closeError }, 'closing the runtime after a failed start failed'),
      )
    await db.close()
    await releaseLocks()
    throw error
  }
}

/** Listens on `port` (0: any) and answers the port bound. */
function listen(server: Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, host, () => {
      server.off('error', reject)
      resolve((server.address() as AddressInfo).port)
    })
  })
}
