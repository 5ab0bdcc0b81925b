import type { RuntimeEvents } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { Clock } from '../clock.js'
import type { ResolvedConfig } from '../config.js'
import { runtimeIdOf } from '../data-dir.js'
import { type ClaimedDataDir, newRuntime, openRuntimePort } from '../local-runtime.js'
import type { RuntimeHost } from './runtime-host.js'

/**
 * `--role all`: the runtime in this process, on the claimed data dir's pool, reached through its
 * `LocalRuntimePort`.
 */
export async function openLocalRuntime(options: {
  config: ResolvedConfig
  clock: Clock
  logger: Logger
  events: RuntimeEvents
  dataDir: ClaimedDataDir
}): Promise<RuntimeHost> {
  const { config, logger } = options
  const runtime = newRuntime(config, logger)
  const { port } = await openRuntimePort(runtime, config, options.dataDir, {
    clock: options.clock,
    logger,
    events: options.events,
  })
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
