import { existsSync } from 'node:fs'
import { mkdir } from 'node:fs/promises'
import path from 'node:path'
import { createShippingBucket, EgressCa, Runtime } from '@cairn/runtime'
import { checkHost, describeFailure, hostRefusal } from '@cairn/runtime/doctor'
import {
  type EgressSite,
  LocalRuntimePort,
  type PortShippingOptions,
  type RuntimeEvents,
} from '@cairn/runtime/port'
import type { Logger } from 'pino'
import { type Clock, iso } from './clock.js'
import type { ResolvedConfig } from './config.js'
import { runtimeIdOf, secureDataDir } from './data-dir.js'
import { DataDirLock } from './data-dir-lock.js'
import type { Db } from './db/database.js'
import { SharedFiles } from './db/shared-files.js'
import type { RuntimeHost } from './runtime-host/runtime-host.js'
import { SecretCipher } from './secrets/cipher.js'

/**
 * This machine's runtime as `cairn server` (role all) and `cairn node` open it: the data dir and
 * pool claimed, the runtime opened, its port. One composition, used by both.
 */

export interface ClaimedDataDir {
  /** The trees kept owner-only (the data dir's pool, a pool given by path). */
  poolTrees: string[]
  releaseLocks(): Promise<void>
}

/**
 * `cairn doctor`'s checks, at the start of a server or node that runs a runtime, before anything
 * is touched: what it cannot run without refuses the start (`unavailable`, each missing piece with
 * its fix), what it can logs a warning in the doctor's words and the start goes on without it.
 */
export async function checkRuntimeHost(config: ResolvedConfig, logger: Logger): Promise<void> {
  const report = await checkHost({
    dataDir: config.dataDir,
    storage: config.storage,
    poolPath: config.poolPath,
    isolation: config.isolation,
  })
  const refusal = hostRefusal(report)
  if (refusal) throw refusal
  for (const check of report.degraded)
    logger.warn({ check: check.id, found: check.found, fix: check.fix }, describeFailure(check))
}

/**
 * Creates and claims the data dir (and a pool given by path) before anything else: a second
 * process on it would take the running one's sandboxes, snapshots and pool for a crashed
 * predecessor's. Leaves it owner-only.
 */
export async function claimDataDir(config: ResolvedConfig, logger: Logger): Promise<ClaimedDataDir> {
  await mkdir(config.dataDir, { recursive: true, mode: 0o700 })
  const locks = [
    await DataDirLock.acquire(config.dataDir, {
      onLost: () =>
        logger.error({ dataDir: config.dataDir }, 'the data dir lock was lost (its flock helper ended)'),
    }),
  ]
  const releaseLocks = async () => {
    await Promise.all(locks.map((lock) => lock.release()))
  }
  const poolTrees = [path.join(config.dataDir, 'pool'), ...(config.poolPath ? [config.poolPath] : [])]
  try {
    // A pool given by path could be shared by two data dirs by mistake: it is claimed as well.
    if (config.poolPath !== undefined) {
      if (config.storage === 'dir') await mkdir(config.poolPath, { recursive: true })
      if (existsSync(config.poolPath)) {
        const poolPath = config.poolPath
        locks.push(
          await DataDirLock.acquire(poolPath, {
            what: 'storage pool',
            option: '--pool-path',
            onLost: () =>
              logger.error({ poolPath }, 'the storage pool lock was lost (its flock helper ended)'),
          }),
        )
      }
    }
    // Owner-only before anything else is written in it; what an older install left 0644 is fixed too.
    await secureDataDir(config.dataDir, poolTrees)
  } catch (error) {
    await releaseLocks()
    throw error
  }
  return { poolTrees, releaseLocks }
}

export function mebibytes(mib: number | undefined): number | undefined {
  return mib ? mib * 1024 * 1024 : undefined
}

/** The runtime of a claimed data dir, not opened yet (`openRuntimePort` opens it). */
export function newRuntime(config: ResolvedConfig, logger: Logger): Runtime {
  return new Runtime({
    dataDir: config.dataDir,
    storage: config.storage,
    poolPath: config.poolPath,
    poolImageSizeBytes: config.poolImageSizeBytes,
    runBase: config.runBase,
    isolation: config.isolation,
    spareLaunchers: config.spareLaunchers,
    residentPauses: { max: config.residentPauses, idleMs: config.residentPauseMs },
    gvisor: config.gvisorPoolSize === undefined ? undefined : { poolSize: config.gvisorPoolSize },
    workspaceQuotaBytes: mebibytes(config.workspaceQuotaMiB),
    tenantQuotaBytes: mebibytes(config.tenantQuotaMiB),
    poolReserveBytes: mebibytes(config.poolReserveMiB),
    imagesQuotaBytes: mebibytes(config.imagesQuotaMiB),
    logger: logger.child({ component: 'runtime' }),
  })
}

/**
 * Opens the runtime (mounting its pool, reaping what an earlier run left) and answers its port,
 * the one way in to it. `events`: where pause and network events go.
 */
export async function openRuntimePort(
  runtime: Runtime,
  config: ResolvedConfig,
  dataDir: ClaimedDataDir,
  options: { clock: Clock; logger: Logger; events?: RuntimeEvents; shipping?: ShippingHooks | undefined },
): Promise<{ port: LocalRuntimePort; egressSite: EgressSite }> {
  const { logger } = options
  const { orphansReaped } = await runtime.open()
  try {
    // The pool image (and anything else the runtime made) owner-only too.
    await secureDataDir(config.dataDir, dataDir.poolTrees)
  } catch (error) {
    await runtime.close().catch(() => {})
    throw error
  }
  if (orphansReaped > 0) logger.warn({ orphansReaped }, 'reaped sandboxes left by an earlier run')
  const egressSite: EgressSite = {
    privateExceptions: new Set(config.egressPrivateExceptions),
    hosts: config.egressHosts,
    limits: config.egressLimits,
  }
  const port = new LocalRuntimePort(runtime, {
    clock: options.clock,
    events: options.events,
    egressSite,
    maxImageBytes: config.maxImageMiB * 1024 * 1024,
    shipping: config.shipping
      ? {
          bucket: createShippingBucket(config.shipping),
          observer: {
            failed: ({ sessionId, error, attempt, retryInMs }) =>
              logger.warn(
                { session: sessionId, code: error.code, err: error.message, attempt, retryInMs },
                'shipping a snapshot failed; it is tried again',
              ),
          },
          ...options.shipping,
        }
      : undefined,
  })
  const quotas = await port.quotaStatus()
  if (quotas.warning) logger.warn({ code: quotas.warning.code }, quotas.warning.message)
  return { port, egressSite }
}

/**
 * With a shared database (PostgreSQL) every replica and node uses the same copy of some files:
 * the egress CA (sandboxes trust one CA wherever they run) and, for API replicas, the secrets key
 * (a secret sealed by one opens on another). The first process's copy is kept in the database.
 */
export async function syncSharedFiles(
  db: Db,
  dataDirPath: string,
  clock: Clock,
  what: { secretKey: boolean; node?: boolean },
): Promise<void> {
  const shared = new SharedFiles(db, () => iso(clock.now()), { node: what.node ?? false })
  if (what.secretKey && !process.env.CAIRN_SECRET_KEY)
    await shared.sync('secret.key', dataDirPath, ['secret.key'], async () => {
      await SecretCipher.load(path.join(dataDirPath, 'secret.key'))
    })
  const caDir = path.join(dataDirPath, 'egress-ca')
  await shared.sync('egress-ca', caDir, ['ca.key', 'ca.pem'], async () => {
    await EgressCa.load(caDir)
  })
}

/**
 * `--role all`: the runtime in this process, on the claimed data dir's pool, as the server's
 * runtime host (its `LocalRuntimePort`); `runtime` is for the composition root alone.
 */
/** What the composition root does with shipped snapshots (the node records them in PostgreSQL). */
export type ShippingHooks = Pick<PortShippingOptions, 'confirmed' | 'owns'>

export async function openLocalRuntime(
  config: ResolvedConfig,
  dataDir: ClaimedDataDir,
  options: { clock: Clock; logger: Logger; events: RuntimeEvents; shipping?: ShippingHooks | undefined },
): Promise<RuntimeHost & { runtime: Runtime; port: LocalRuntimePort }> {
  const { logger } = options
  const runtime = newRuntime(config, logger)
  const { port } = await openRuntimePort(runtime, config, dataDir, options)
  try {
    const quotas = await port.quotaStatus()
    return {
      port,
      runtimeId: await runtimeIdOf(config.dataDir),
      drivers: { isolation: runtime.driver.name, storage: runtime.pool.driver },
      reserveBytes: quotas.reserveBytes,
      runtime,
      routing: undefined,
      describe: () => ({
        pool: runtime.pool.root,
        storage: runtime.pool.describe(),
        driver: runtime.driver.describe(),
      }),
      close: async () => {
        await port.closeShipping()
        await runtime.close()
      },
    }
  } catch (error) {
    await runtime
      .close()
      .catch((closeError: unknown) =>
        logger.error({ err: closeError }, 'closing the runtime after a failed start failed'),
      )
    throw error
  }
}
