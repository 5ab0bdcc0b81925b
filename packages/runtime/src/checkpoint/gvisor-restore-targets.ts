import type { Duplex } from 'node:stream'
import type { GvisorSandbox } from '../sandbox/gvisor-sandbox.js'
import { type Logger, logAndGoOn } from '../util/logger.js'

/**
 * A gVisor sandbox booted ahead for a paused session's next restore (`runsc create` of the bundle
 * the restore will use, nothing run in it), its launcher waiting on `commandPipe` for the `runsc
 * restore` it becomes (sandbox/launcher.ts, `RESTORE_TARGET_LAUNCHER`).
 */
export interface RestoreTarget {
  sandbox: GvisorSandbox
  commandPipe: Duplex
  /** The bundle's layout (its config.json but for `process`): a restore of another layout cannot use it. */
  layout: string
}

/** Default bound on targets kept (each a booted sandbox: about 16 MiB PSS with its gofer). */
export const DEFAULT_RESTORE_TARGETS = 4
/** How long a target is kept for a session that does not come back. */
export const RESTORE_TARGET_TTL_MS = 10 * 60_000

/**
 * The restore targets of one gVisor driver, by container id: at most `limit` (the oldest is
 * destroyed to make room), each destroyed after `ttlMs` unless taken first. A target is used once.
 */
export class RestoreTargets {
  private readonly targets = new Map<string, { target: RestoreTarget; timer: NodeJS.Timeout }>()

  constructor(
    private readonly limit: number,
    private readonly ttlMs: number,
    private readonly logger: Logger,
  ) {}

  get size(): number {
    return this.targets.size
  }

  has(id: string): boolean {
    return this.targets.has(id)
  }

  async add(id: string, target: RestoreTarget): Promise<void> {
    await this.drop(id)
    while (this.targets.size >= this.limit) {
      const oldest = this.targets.keys().next().value
      if (oldest === undefined) break
      await this.drop(oldest)
    }
    const timer = setTimeout(() => void this.drop(id), this.ttlMs).unref()
    this.targets.set(id, { target, timer })
  }

  /** The target booted for container `id`, now the caller's (to restore into or destroy). */
  take(id: string): RestoreTarget | undefined {
    const kept = this.targets.get(id)
    if (!kept) return undefined
    clearTimeout(kept.timer)
    this.targets.delete(id)
    return kept.target
  }

  /**
   * Destroys the target for `id` (its launcher, sandbox, bundle and cgroup): the one kept, or
   * `taken` when the caller took it and could not use it (a failed restore into it).
   */
  async drop(id: string, taken?: RestoreTarget): Promise<void> {
    const target = taken ?? this.take(id)
    if (!target) return
    target.commandPipe.end()
    await target.sandbox
      .destroy()
      .catch(logAndGoOn(this.logger, 'warn', { sandboxId: id }, 'could not destroy a restore target'))
  }

  async close(): Promise<void> {
    for (const id of [...this.targets.keys()]) await this.drop(id)
  }
}
