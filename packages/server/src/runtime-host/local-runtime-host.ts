import path from 'node:path'
import { EgressCa, Runtime } from '@cairn/runtime'
import { type EgressSite, LocalRuntimePort, type RuntimeEvents } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { Clock } from '../clock.js'
import type { ResolvedConfig } from '../config.js'
import { runtimeIdOf, secureDataDir } from '../data-dir.js'
import type { SharedFiles } from '../db/shared-files.js'
import type { RuntimeHost } from './runtime-host.js'

function mebibytes(mib: number | undefined): number | undefined {
  return mib ? mib * 1024 * 1024 : undefined
}

/**
 * `--role all`: the runtime in this process, on the data dir's pool (its lock taken by the
 * caller), reached through `LocalRuntimePort`. With a shared database the egress CA is the one
 * stored there (the first replica's), so every replica's sandboxes trust one CA.
 */
export async function openLocalRuntime(options: {
  config: ResolvedConfig
  clock: Clock
  logger: Logger
  events: RuntimeEvents
  egressSite: EgressSite
  poolTrees: string[]
  shared: SharedFiles | undefined
}): Promise<RuntimeHost> {
  const { config, logger } = options
  const runtime = new Runtime({
    dataDir: config.dataDir,
    storage: config.storage,
    poolPath: config.poolPath,
    poolImageSizeBytes: config.poolImageSizeBytes,
    runBase: config.runBase,
    isolation: config.isolation,
    spareLaunchers: config.spareLaunchers,
    gvisor: config.gvisorPoolSize === undefined ? undefined : { poolSize: config.gvisorPoolSize },
    workspaceQuotaBytes: mebibytes(config.workspaceQuotaMiB),
    tenantQuotaBytes: mebibytes(config.tenantQuotaMiB),
    poolReserveBytes: mebibytes(config.poolReserveMiB),
    logger: logger.child({ component: 'runtime' }),
  })
  const { orphansReaped } = await runtime.open()
  try {
    // The pool image (and anything else the runtime made) owner-only too.
    await secureDataDir(config.dataDir, options.poolTrees)
    if (orphansReaped > 0) logger.warn({ orphansReaped }, 'reaped sandboxes left by an earlier run')
    const port = new LocalRuntimePort(runtime, {
      clock: options.clock,
      events: options.events,
      egressSite: options.egressSite,
      maxImageBytes: config.maxImageMiB * 1024 * 1024,
    })
    const quotas = runtime.pool.quotaStatus()
    if (quotas.warning) logger.warn({ code: quotas.warning.code }, quotas.warning.message)
    if (options.shared) {
      const caDir = path.join(config.dataDir, 'egress-ca')
      await options.shared.sync('egress-ca', caDir, ['ca.key', 'ca.pem'], async () => {
        await EgressCa.load(caDir)
      })
    }
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
      close: () => runtime.close(),
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
