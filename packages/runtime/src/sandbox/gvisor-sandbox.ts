import type { ChildProcess, ChildProcessWithoutNullStreams } from 'node:child_process'
import { readdirSync } from 'node:fs'
import { rm } from 'node:fs/promises'
import type { Readable, Writable } from 'node:stream'
import { type Logger, logAndGoOn, noopLogger } from '../util/logger.js'
import { writeBytesOf } from '../util/proc-io.js'
import type { CgroupManager } from './cgroups.js'
import type { Sandbox, SandboxExit } from './driver.js'
import { type RunscConfig, runsc } from './runsc.js'

/** How long after the sandbox's exit its output pipes may take to drain. */
const EXIT_DRAIN_MS = 1000

/** What a gVisor sandbox holds on the host besides its processes, released by `destroy`. */
export interface GvisorResources {
  cgroups: CgroupManager
  /** The cgroup, which is also runsc's container id. */
  name: string
  runsc: RunscConfig
  bundle: string
  /** Host mounts made for this sandbox (pool slots), unmounted once it is gone. */
  release?: (() => Promise<void>) | undefined
  /** Where it reports the steps it goes on without; default none. */
  logger?: Logger | undefined
}

/**
 * A sandbox whose agent runs in gVisor: `runsc run` (started cold) or a pool slot `runsc create`d
 * ahead and started on claim. Freezing and destroying act on every host process of the sandbox
 * through its cgroup (runsc, gofer, sentry, ptrace stubs).
 */
export class GvisorSandbox implements Sandbox {
  readonly driver = 'gvisor'
  readonly exited: Promise<SandboxExit>
  private destroyed = false
  private done = false
  /** The sandbox's host processes at the last `writtenBytes` call (see there). */
  private seenPids: ReadonlySet<number> = new Set()

  /**
   * @param process the host process whose end is the sandbox's end, with the agent's stdio: `runsc run`,
   *   or for a pool slot `runsc create`'s stdio and a `runsc wait` that reports the exit.
   */
  constructor(
    readonly id: string,
    readonly pid: number,
    private readonly io: { stdin: Writable; stdout: Readable; stderr: Readable },
    ended: Promise<{ code: number | null; signal: NodeJS.Signals | null }>,
    private readonly resources: GvisorResources,
  ) {
    // A write to a dead agent's stdin must surface as the turn's failure, not as a crash.
    io.stdin.on('error', () => undefined)
    const drained = Promise.all([closed(io.stdout), closed(io.stderr)])
    this.exited = ended.then(async ({ code, signal }) => {
      // The sentry holds the other ends of the pipes until the agent and all it started are gone;
      // a bounded wait keeps a stuck pipe from hiding the exit.
      await Promise.race([drained, new Promise((r) => setTimeout(r, EXIT_DRAIN_MS).unref())])
      this.done = true
      return { code, signal, limit: this.limitHit() }
    })
  }

  get stdin(): Writable {
    return this.io.stdin
  }
  get stdout(): Readable {
    return this.io.stdout
  }
  get stderr(): Readable {
    return this.io.stderr
  }

  limitHit(): 'memory' | 'pids' | undefined {
    const counters = this.resources.cgroups.counters(this.resources.name)
    if (counters.oomKills > 0) return 'memory'
    if (counters.pidsMaxHits > 0) return 'pids'
    return undefined
  }

  /**
   * Stops every host process of the sandbox through its cgroup's freezer, as the bwrap driver
   * does: the sentry (and with it every task inside gVisor), the gofer and the platform's stubs,
   * so no write of the sandbox reaches the host until `thaw`. `runsc pause`/`resume` would stop
   * the same tasks, but each is a runsc process to start (about 20 ms here, two per snapshot).
   */
  async freeze(): Promise<void> {
    if (this.done || this.destroyed) return
    await this.resources.cgroups.freeze(this.resources.name, true)
  }

  async thaw(): Promise<void> {
    if (this.done || this.destroyed) return
    await this.resources.cgroups.freeze(this.resources.name, false)
  }

  /**
   * Bytes of file data the sandbox's host processes have dirtied (see `dirtiedBytes`). Under
   * gVisor the agent's writes reach the host through those processes, all in the sandbox's
   * cgroup: `write()`s through the sentry (or the gofer), stores through a shared mapping of a
   * workspace file through the platform's stub process that holds the agent's address space.
   * gVisor starts host processes only for itself (stubs are pooled, never expected to exit), so
   * the set only grows while the sandbox is healthy; a process that left it since the previous
   * call (exited: a zombie is no longer listed) may have taken its count along, as nobody inside
   * reaps it, and the figure is then unknown. So the live processes alone are summed.
   */
  writtenBytes(): number | undefined {
    if (this.done || this.destroyed) return undefined
    const pids = this.resources.cgroups.pidsSync(this.resources.name)
    const live = new Set(pids)
    const kept = [...this.seenPids].every((pid) => live.has(pid))
    this.seenPids = live
    return kept && pids.length > 0 ? writeBytesOf(pids) : undefined
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return
    this.destroyed = true
    const { cgroups, name, runsc: config } = this.resources
    const logger = this.resources.logger ?? noopLogger
    // A frozen sandbox (destroyed during a snapshot) must thaw to die on a v1 freezer; on v2 the
    // cgroup kill below works frozen or not, so a failed thaw is only reported.
    await cgroups
      .freeze(name, false)
      .catch(
        logAndGoOn(logger, 'debug', { sandboxId: this.id }, 'could not thaw the sandbox before killing it'),
      )
    // Through the cgroup: runsc, the gofer, the sentry and its stubs die at once, paused or not.
    await cgroups.kill(name)
    await Promise.race([this.exited, new Promise((r) => setTimeout(r, 2000))])
    // runsc cleans its state itself when `run` ends normally; after a kill it is left behind.
    // Its processes are dead (the cgroup kill): what a failed delete leaves is runsc state, which
    // `reapOrphans` deletes at the next start.
    if (hasState(config.root, name)) {
      await runsc(config, ['delete', '--force', name]).catch(
        logAndGoOn(
          logger,
          'warn',
          { sandboxId: this.id },
          'runsc delete failed; its state stays until the next start',
        ),
      )
    }
    await this.resources.release?.()
    await rm(this.resources.bundle, { recursive: true, force: true })
    await cgroups.remove(name)
  }
}

/** The end of a `runsc run` child: its exit status is the agent's (128+n for a signal). */
export function childEnd(
  child: ChildProcess,
): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })))
}

export function childIo(child: ChildProcessWithoutNullStreams) {
  return { stdin: child.stdin, stdout: child.stdout, stderr: child.stderr }
}

function closed(stream: Readable): Promise<void> {
  return new Promise((resolve) => {
    if (stream.destroyed || stream.readableEnded) return resolve()
    stream.once('close', () => resolve())
    stream.once('end', () => resolve())
  })
}

/** Whether runsc still has state files for the container (named `<id>_sandbox:<id>.state` …). */
function hasState(root: string, id: string): boolean {
  try {
    return readdirSync(root).some((name) => name.startsWith(`${id}_`))
  } catch {
    return false
  }
}
