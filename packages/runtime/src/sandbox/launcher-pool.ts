import { type ChildProcess, spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import type { FileHandle } from 'node:fs/promises'
import type { Duplex, Writable } from 'node:stream'
import { newId } from '@cairn/protocol'
import { type Logger, logAndGoOn, noopLogger } from '../util/logger.js'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'
import type { CgroupLimits, CgroupManager } from './cgroups.js'
import { BWRAP_LAUNCHER_PREFIX, ENV_FD, LAUNCHER_SHELL, pooledLauncherArgs } from './launcher.js'

/** How long after a launcher was taken the pool starts its replacement. */
const REFILL_DELAY_MS = 25

/** A launcher already in its own fresh cgroup, waiting for the command that becomes the sandbox. */
export interface SpareLauncher {
  /** Its stdin and stdout are /dev/null (the sandbox's are `commandPipe`), its stderr a pipe. */
  child: ChildProcess
  cgroupName: string
  limits: CgroupLimits
  /**
   * fd 4 of the launcher (a socket pair): its ready byte came on it, the command goes to it, and
   * then it is the sandbox's stdin and stdout.
   */
  commandPipe: Duplex
  /** fd 5 of the launcher (`ENV_FD`): the sandbox's environment, for bwrap's `--args`. */
  envPipe: Writable
}

export interface LauncherPoolOptions {
  cgroups: CgroupManager
  /** Where it reports the steps it goes on without (failed cleanups); default none. */
  logger?: Logger | undefined
  /** How many launchers to keep ready. */
  size: number
  /** The seccomp program the sandbox reads through fd 3, opened for each launcher. */
  seccompFd: () => Promise<FileHandle | undefined>
}

/**
 * Launchers started ahead of the sessions that will use them. Moving a process into a cgroup
 * (`echo $$ > cgroup.procs`) waits for an RCU grace period when no migration happened in the last
 * one — 8–17 ms on this kind of host, whether the cgroup is new or not — and forking the server's
 * large process to spawn the launcher blocks its event loop for several ms. A spare launcher has
 * paid both before a session asks: a cold start then only writes the sandbox's limits into its
 * cgroup (microseconds) and hands it the setpriv + bwrap command.
 */
export class LauncherPool {
  private readonly spare: SpareLauncher[] = []
  private filling: Promise<void> | undefined
  private closed = false
  private lastLimits: CgroupLimits | undefined

  private readonly logger: Logger

  constructor(private readonly options: LauncherPoolOptions) {
    this.logger = options.logger ?? noopLogger
  }

  static available(): boolean {
    return existsSync(LAUNCHER_SHELL)
  }

  /** A ready launcher (any limits: the caller rewrites them), or undefined when none is left. */
  take(limits: CgroupLimits): SpareLauncher | undefined {
    this.lastLimits = limits
    let taken: SpareLauncher | undefined
    while (!taken && this.spare.length > 0) {
      const candidate = this.spare.shift() as SpareLauncher
      if (candidate.child.exitCode === null && candidate.child.signalCode === null) taken = candidate
      else void this.discard(candidate)
    }
    this.refill()
    return taken
  }

  /** Tops the pool up in the background (one launcher at a time, after the current event). */
  refill(): void {
    if (this.closed || this.filling || this.options.size <= 0) return
    this.filling = (async () => {
      // Let the sandbox that just took a launcher come up first: spawning blocks the event loop
      // for a few ms and the new launcher competes for the CPUs while that sandbox starts.
      await new Promise((resolve) => setTimeout(resolve, REFILL_DELAY_MS).unref())
      while (!this.closed && this.spare.length < this.options.size) {
        // A launcher that cannot start now leaves the pool short: each sandbox then starts its own
        // (and says why it cannot), so filling stops until the next take.
        const launcher = await this.launch(this.lastLimits ?? DEFAULT_LIMITS).catch(
          logAndGoOn(
            this.logger,
            'warn',
            {},
            'could not start a spare launcher; sandboxes start without one',
          ),
        )
        if (!launcher) break
        if (this.closed) {
          await this.discard(launcher)
          break
        }
        this.spare.push(launcher)
      }
    })().finally(() => {
      this.filling = undefined
    })
  }

  private async launch(limits: CgroupLimits): Promise<SpareLauncher | undefined> {
    return startLauncher(this.options.cgroups, newId('sandbox'), limits, await this.options.seccompFd())
  }

  /** Ends a launcher (taken or not) that will not be used, and removes its cgroup. */
  discard(launcher: SpareLauncher): Promise<void> {
    return discardLauncher(this.options.cgroups, launcher, this.logger)
  }

  /** Ends the waiting launchers and removes their cgroups. */
  async close(): Promise<void> {
    this.closed = true
    await this.filling
    const left = this.spare.splice(0)
    for (const launcher of left) await this.discard(launcher)
  }
}

/** Ends a launcher that will not be used (its command pipe closed, it exits), and removes its cgroup. */
export async function discardLauncher(
  cgroups: CgroupManager,
  launcher: SpareLauncher,
  logger: Logger,
): Promise<void> {
  launcher.commandPipe.end()
  launcher.envPipe.end()
  // Its command pipe is closed, so the launcher exits on its own; `remove` below still reaps the cgroup.
  await cgroups
    .kill(launcher.cgroupName)
    .catch(logAndGoOn(logger, 'debug', { cgroup: launcher.cgroupName }, 'could not kill a spare launcher'))
  await cgroups.remove(launcher.cgroupName)
}

const DEFAULT_LIMITS: CgroupLimits = { memoryBytes: 512 * 1024 * 1024, pids: 256, cpus: 1 }

/**
 * A launcher in a new cgroup `cgroupName` with `limits` and a mount namespace of its own, waiting
 * for its command on fd 4 and bwrap's environment on fd 5 (`ENV_FD`); `seccompFd` (closed here once
 * passed on) is its fd 3. Returned once it said it is ready (so its namespace can take its
 * sandbox's mounts); undefined when it could not start (its cgroup removed).
 */
export async function startLauncher(
  cgroups: CgroupManager,
  cgroupName: string,
  limits: CgroupLimits,
  seccompFd: FileHandle | undefined,
): Promise<SpareLauncher | undefined> {
  const procsFiles = await cgroups.create(cgroupName, limits)
  // Closes what it inherited above fd 5, joins the cgroups, waits for its command (launcher.ts).
  const [unshare = 'unshare', ...prefix] = BWRAP_LAUNCHER_PREFIX
  const child = spawn(unshare, [...prefix, LAUNCHER_SHELL, ...pooledLauncherArgs(procsFiles)], {
    stdio: ['ignore', 'ignore', 'pipe', seccompFd ? seccompFd.fd : 'ignore', 'pipe', 'pipe'],
    env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
    ...OWN_PROCESS_GROUP,
  })
  await seccompFd?.close()
  const commandPipe = child.stdio[4] as Duplex | null | undefined
  const envPipe = (child.stdio as unknown as (Writable | null | undefined)[])[ENV_FD]
  if (child.pid === undefined || !commandPipe || !envPipe || !child.stderr) {
    await cgroups.remove(cgroupName)
    return undefined
  }
  // A launcher that dies while waiting (killed from outside) is skipped by `take`; one that dies
  // before reading its pipes ends the sandbox, whose exit says so.
  child.on('error', () => undefined)
  commandPipe.on('error', () => undefined)
  envPipe.on('error', () => undefined)
  const launcher = { child, cgroupName, limits, commandPipe, envPipe }
  if (await launcherReady(launcher)) return launcher
  await cgroups.kill(cgroupName).catch(() => undefined)
  await cgroups.remove(cgroupName)
  return undefined
}

/** Whether the launcher said it is ready (its byte on fd 4) before it ended. */
export function launcherReady({
  child,
  commandPipe,
}: Pick<SpareLauncher, 'child' | 'commandPipe'>): Promise<boolean> {
  return new Promise((resolve) => {
    const settle = (ok: boolean) => {
      commandPipe.off('data', onData)
      child.off('exit', onExit)
      commandPipe.pause()
      resolve(ok)
    }
    const onData = () => settle(true)
    const onExit = () => settle(false)
    commandPipe.on('data', onData)
    child.on('exit', onExit)
  })
}
