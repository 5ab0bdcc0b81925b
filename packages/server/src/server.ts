import { chmod, readFile, writeFile } from 'node:fs/promises'
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import path from 'node:path'
import type { Runtime } from '@cairn/runtime'
import pino, { type Logger } from 'pino'
import { AgentService } from './agents/agent-service.js'
import { BuildLogs } from './agents/build-logs.js'
import { buildApp } from './app.js'
import { ApiKeyStore, DEFAULT_TENANT_ID } from './auth/api-keys.js'
import { systemClock } from './clock.js'
import { type ClusterControl, startClusterControl } from './cluster/cluster-control.js'
import { resolveConfig, type ServerOptions } from './config.js'
import { writeCredentialsIfMissing } from './credentials.js'
import { createOwnerOnly, runtimeIdOf } from './data-dir.js'
import { type Db, openDatabase } from './db/database.js'
import type { ImageService } from './images/image-service.js'
import { ManualSnapshotCap } from './limits/snapshot-cap.js'
import { claimDataDir, mebibytes, newRuntime, openRuntimePort, syncSharedFiles } from './local-runtime.js'
import { MemoryService } from './memory/memory-service.js'
import { MetricsRegistry } from './metrics/registry.js'
import { createPreviewListener, type PreviewListener } from './previews/preview-listener.js'
import { DEFAULT_PREVIEW_DOMAIN, PreviewOrigins } from './previews/preview-origins.js'
import { PreviewRevocations } from './previews/preview-revocations.js'
import { PreviewService } from './previews/preview-service.js'
import { PreviewSigner } from './previews/preview-signer.js'
import { RetentionService } from './retention/retention-service.js'
import { SecretCipher } from './secrets/cipher.js'
import { SecretStore } from './secrets/secret-store.js'
import type { SessionObserver } from './sessions/session-observer.js'
import { SessionRuntimeEvents } from './sessions/session-runtime-events.js'
import { SessionService } from './sessions/session-service.js'
import { SetupService } from './setup/setup-service.js'
import { WorkspaceService } from './workspace/workspace-service.js'

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
  runtime: Runtime
  close(): Promise<void>
}

/** Kept free on the data dir's disk (database, transcripts) when the pool has no reserve of its own. */
const DATA_DISK_RESERVE_BYTES = 64 * 1024 * 1024

/** Starts the control plane and the local runtime: database, storage pool, sandboxes, HTTP API. */
export async function startServer(options: ServerOptions = {}): Promise<RunningServer> {
  const config = resolveConfig(options)
  const clock = options.clock ?? systemClock
  const logger = pino({ level: config.logLevel, base: { service: 'cairn' } })
  const dataDir = await claimDataDir(config, logger)
  const releaseLocks = () => dataDir.releaseLocks()
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
  const runtime = newRuntime(config, logger)
  let opened = false
  let previewListener: PreviewListener | undefined
  let cluster: ClusterControl | undefined
  try {
    // The server reaches the runtime only through its port; what the runtime reports outside
    // a call (pause and network events) goes to the sessions' records once they exist.
    let runtimeEvents: SessionRuntimeEvents | undefined
    const { port: runtimePort } = await openRuntimePort(runtime, config, dataDir, {
      clock,
      logger,
      events: {
        pause: (id, event) => runtimeEvents?.pause(id, event),
        network: (id, event) => runtimeEvents?.network(id, event),
      },
    })
    opened = true
    const quotas = await runtimePort.quotaStatus()
    const keys = new ApiKeyStore(db, clock)
    await keys.ensureTenant(DEFAULT_TENANT_ID, 'default')
    const runtimeId = await runtimeIdOf(config.dataDir)
    if (db.dialect === 'postgres') await syncSharedFiles(db, config.dataDir, clock, { secretKey: true })
    const cipher = await SecretCipher.load(path.join(config.dataDir, 'secret.key'))
    const secrets = new SecretStore(db, cipher, clock)
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
      images: { defaultImage: config.defaultImage, debianMirror: config.debianMirror },
      operatorLimits: config.operatorLimits,
    })
    const metrics = new MetricsRegistry()
    const memory = new MemoryService({
      db,
      runtime: runtimePort,
      clock,
      logger,
      artifactRoot: path.join(config.dataDir, 'artifacts'),
      artifactLimits: {
        tenantBytes: mebibytes(config.tenantQuotaMiB),
        reserveBytes: quotas.reserveBytes ?? DATA_DISK_RESERVE_BYTES,
      },
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
    const sessions = new SessionService({
      runtimeId,
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
    })
    runtimeEvents = new SessionRuntimeEvents(sessions.store, clock, logger)
    let retention: RetentionService | undefined
    const workspace = new WorkspaceService({
      db,
      runtime: runtimePort,
      runtimeDrivers: { isolation: runtime.driver.name, storage: runtime.pool.driver },
      sessions,
      agents,
      clock,
      logger,
      archiveLimits: { maxFiles: config.maxArchiveFiles, maxUnpackedBytes: config.maxUnpackedBytes },
      keepAutoSnapshots: async (tenantId) => (await retention?.policy(tenantId))?.keepAutoSnapshots ?? 50,
      setupOf: (sessionId) => setup.store.info(sessionId),
      manualSnapshotCap: new ManualSnapshotCap(db, config.operatorLimits),
    })
    const retentionService = new RetentionService({
      db,
      runtime: runtimePort,
      sessions,
      workspace,
      clock,
      logger,
      memoryCheckpointTtlMs: config.memoryCheckpointTtlMs,
    })
    retention = retentionService
    setup.onSucceeded(async (row) => (await workspace.snapshotAfterSetup(row)).id)
    setup.onWorkspaceWritten((sessionId) => sessions.advanceGeneration(sessionId))
    const recovered = await sessions.recover()
    await setup.store.recoverAfterRestart(runtimeId)
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
    const previews = new PreviewService({
      db,
      keys,
      sessions,
      signer: new PreviewSigner(cipher.deriveKey('preview-url')),
      revocations: new PreviewRevocations(db),
      runtime: runtimePort,
      clock,
      logger,
    })
    observers.push(workspace.policy, previews)
    previewListener = createPreviewListener(previews, config.previewDomain, logger)
    const previewPort = await listen(previewListener.server, config.previewPort, config.host)
    if (config.previewDomain === DEFAULT_PREVIEW_DOMAIN && !LOOPBACK_HOSTS.has(config.host)) {
      logger.warn(
        { host: config.host, previewDomain: config.previewDomain },
        'previews are served at <port>-ses-<id>.localhost, which only a browser on this machine reaches; set --preview-domain (CAIRN_PREVIEW_DOMAIN) to a domain whose subdomains resolve to this server',
      )
    }
    // On PostgreSQL the server is part of a cluster's control plane: a candidate for leader (node
    // failure handling), the nodes' routes and figures. The reaper's passes stay with each
    // replica here: they act on the sessions of its own runtime.
    cluster =
      db.dialect === 'postgres' && config.databaseUrl
        ? startClusterControl({
            db,
            databaseUrl: config.databaseUrl,
            heartbeatMs: config.heartbeatMs,
            leaseMs: config.leaseMs,
            logger,
          })
        : undefined
    const app = await buildApp({
      cluster,
      db,
      logger,
      keys,
      secrets,
      workspace,
      retention: retentionService,
      metrics,
      memory,
      setup,
      previews,
      previewOrigins: new PreviewOrigins(config.previewDomain, previewPort),
      runtime: runtimePort,
      agents,
      sessions,
      maxUploadBytes: config.maxUploadBytes,
      rateLimitPerSecond: config.rateLimitPerSecond,
      operatorLimits: config.operatorLimits,
      sseHeartbeatMs: config.sseHeartbeatMs,
      version: SERVER_VERSION,
      compat: config.compatPrefix
        ? {
            prefix: config.compatPrefix,
            archiveLimits: { maxFiles: config.maxArchiveFiles, maxUnpackedBytes: config.maxUnpackedBytes },
          }
        : undefined,
    })
    const address = await app.listen({ port: config.port, host: config.host })
    const port = Number(new URL(address).port)
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
    sessions.startReaper(config.reaperIntervalMs, async () => {
      await retentionService.apply()
      await agents.images.collect()
    })
    logger.info(
      {
        url,
        previews: `http://<port>-ses-<id>.${config.previewDomain}:${previewPort}`,
        dataDir: config.dataDir,
        pool: runtime.pool.root,
        storage: runtime.pool.describe(),
        driver: runtime.driver.describe(),
      },
      'cairn server listening',
    )
    let closing: Promise<void> | undefined
    return {
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
      runtime,
      close() {
        closing ??= (async () => {
          await previewListener?.close()
          await app.close()
          await sessions.drain(config.shutdownGraceMs)
          await workspace.settle()
          await sessions.close()
          await runtime.close()
          await cluster?.close()
          await db.close()
          await releaseLocks()
          logger.info('cairn server stopped')
        })()
        return closing
      },
    }
  } catch (error) {
    await previewListener?.close()
    await cluster?.close()
    // The start's own error is rethrown below; a runtime that also fails to close is logged.
    if (opened)
      await runtime
        .close()
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
