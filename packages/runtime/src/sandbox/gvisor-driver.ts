import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { chmod, lstat, mkdir, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import type { Duplex } from 'node:stream'
import { CairnProblem } from '@cairn/protocol'
import {
  checkpointGvisor,
  restoreArgs,
  restored,
  stdinRelayCommand,
} from '../checkpoint/gvisor-checkpoint.js'
import {
  DEFAULT_RESTORE_TARGETS,
  RESTORE_TARGET_TTL_MS,
  type RestoreTarget,
  RestoreTargets,
} from '../checkpoint/gvisor-restore-targets.js'
import { type Logger, logAndGoOn, noopLogger } from '../util/logger.js'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'
import type { CgroupLimits, CgroupManager } from './cgroups.js'
import type { DriverCapabilities, Sandbox, SandboxDriver, SandboxSpec } from './driver.js'
import { type ClaimTiming, cleanupSlots, GvisorPool, POOL_SLOT_PREFIX } from './gvisor-pool.js'
import { childEnd, childIo, GvisorSandbox } from './gvisor-sandbox.js'
import { buildOciSpec, type GvisorSpecOptions, prepareRootfs } from './gvisor-spec.js'
import { installStatxShim, STATX_PRELOAD_PATH, STATX_SHIM_PATH } from './gvisor-statx-fix.js'
import { LAUNCHER_SHELL, launcherArgs, restoreTargetLauncherArgs } from './launcher.js'
import { launcherReady } from './launcher-pool.js'
import {
  defaultPlatform,
  findBinary,
  imageRunscFlags,
  listContainers,
  type RunscConfig,
  runsc,
  runscFeatures,
  runscFlags,
  runscSelfTest,
  runscVersion,
} from './runsc.js'

export interface GvisorDriverOptions {
  cgroups: CgroupManager
  /** Where it reports the steps it goes on without (failed cleanups); default none. */
  logger?: Logger | undefined
  /** Unprivileged host uid/gid that uid/gid 1000 inside maps to (the owner of what the agent writes). */
  hostUid: number
  hostGid: number
  /** Host directory with generated passwd/group/hosts. */
  etcDir: string
  /** Host directory mounted read-only at /opt/cairn (agent-kit shims and libraries). */
  kitDir: string
  /** This driver's directory: the shared read-only root, the bundles and runsc's state. */
  stateDir: string
  runscPath?: string | undefined
  /** gVisor's platform; by default the fastest this runsc offers (systrap, else ptrace). */
  platform?: string | undefined
  /**
   * Host memory the sandbox's own machinery (runsc, gofer, sentry) may use on top of the agent's
   * `memoryMiB`: the cgroup holds all of it, and the agent's memory lives in the sentry.
   */
  memoryOverheadMiB?: number | undefined
  /** Host tasks of that machinery (runsc, gofer and sentry threads) on top of the agent's share. */
  pidsOverhead?: number | undefined
  /** Pre-started sandboxes kept ready per mount layout (0: every sandbox boots on demand). */
  poolSize?: number | undefined
  /**
   * Restore targets kept at most (`prepareRestore`: a sandbox booted for a paused session's next
   * restore); 0: every restore boots its sandbox. Default `DEFAULT_RESTORE_TARGETS`.
   */
  restoreTargets?: number | undefined
}

export const DEFAULT_GVISOR_MEMORY_OVERHEAD_MIB = 64
export const DEFAULT_GVISOR_PIDS_OVERHEAD = 160
/**
 * Host tasks that carry one task of the agent on the ptrace platform (its stub thread and the
 * sentry's tracer threads), measured at 5 to 10 here. The agent's `pids` limit is enforced on the host
 * tasks, where hitting it is seen (pids.events) and reported as `pids_limit`; it is approximate.
 */
export const GVISOR_HOST_TASKS_PER_TASK = 6
/**
 * The same on systrap (runsc since 2023): one stub process per agent process, about 2 host tasks
 * per agent task over about 25 for the sandbox itself (measured); with ptrace's figures an agent
 * that forks would reach its memory limit long before its pids limit.
 */
const SYSTRAP_HOST_TASKS = { perTask: 2, overhead: 64 }

export type GvisorAvailability = { ok: true; version: string } | { ok: false; reason: string }

/**
 * Runs each sandbox in gVisor (`runsc run` on an OCI bundle generated per sandbox): the agent talks
 * to gVisor's user-space kernel, not the host's. Same layout, environment, uid and stdio as bwrap.
 */
export class GvisorDriver implements SandboxDriver {
  readonly name = 'gvisor'
  readonly capabilities: DriverCapabilities = {
    freeze: true,
    network: false,
    // `runsc checkpoint` / `runsc restore` (see checkpoint/gvisor-checkpoint.ts).
    memorySnapshot: true,
    residentPause: true,
    // The sandbox's loopback lives in gVisor's user-space network stack, not in a host network
    // namespace a relay could enter; reaching it would take a `runsc exec` per connection.
    ports: false,
    // gVisor's netstack has no nftables: egress stays on the explicit proxy (HTTP(S)_PROXY).
    transparentEgress: false,
  }
  readonly runsc: RunscConfig
  private readonly rootfsDir: string
  private readonly bundlesDir: string
  private readonly slotsDir: string
  private readonly pool: GvisorPool | undefined
  private readonly targets: RestoreTargets | undefined
  private readonly logger: Logger
  private prepared: Promise<void> | undefined
  /** Whether the statx shim for old runsc releases is in place (see gvisor-statx-fix.ts). */
  private statxShim = false
  private platformChoice: Promise<PlatformChoice> | undefined
  private chosenPlatform: PlatformChoice | undefined

  constructor(private readonly options: GvisorDriverOptions) {
    this.logger = options.logger ?? noopLogger
    this.runsc = {
      path: options.runscPath ?? 'runsc',
      root: path.join(options.stateDir, 'runsc'),
      platform: options.platform ?? 'ptrace',
    }
    this.rootfsDir = path.join(options.stateDir, 'rootfs')
    this.bundlesDir = path.join(options.stateDir, 'bundles')
    this.slotsDir = path.join(options.stateDir, 'slots')
    const targets = options.restoreTargets ?? DEFAULT_RESTORE_TARGETS
    if (targets > 0) this.targets = new RestoreTargets(targets, RESTORE_TARGET_TTL_MS, this.logger)
    if ((options.poolSize ?? 0) > 0) {
      this.pool = new GvisorPool({
        cgroups: options.cgroups,
        logger: this.logger,
        runsc: this.runsc,
        spec: this.specOptions(),
        size: options.poolSize ?? 0,
        slotsDir: this.slotsDir,
        bundlesDir: this.bundlesDir,
        hostLimits: (spec) => this.hostLimits(spec),
      })
    }
  }

  describe(): string {
    const shim = this.statxShim ? ', statx shim' : ''
    return `gvisor (runsc, ${this.runsc.platform} platform${shim}, host uid ${this.options.hostUid}, ${this.options.cgroups.describe()})`
  }

  /** Whether runsc is installed and runs (it does not start a sandbox; see `selfTest` for that). */
  availability(): Promise<GvisorAvailability> {
    return runscAvailability(this.runsc.path)
  }

  /** Whether a sandbox really starts here (one throwaway `runsc do`, about 0.2 s) on the platform it runs. */
  async selfTest(): Promise<GvisorAvailability> {
    const availability = await this.availability()
    if (!availability.ok) return availability
    // The platform's own probe already started a sandbox here: no second one.
    if ((await this.choosePlatform()).started) return availability
    return probeGvisor(this.runsc)
  }

  /**
   * The platform sandboxes run on, and why: the one the operator named, else systrap where this
   * runsc offers it (runsc since 2023) and a throwaway sandbox starts on it, else ptrace.
   */
  choosePlatform(): Promise<PlatformChoice> {
    this.platformChoice ??= (async () => {
      const features = await runscFeatures(findBinary(this.runsc.path) ?? this.runsc.path)
      this.runsc.featureFlags = features.featureFlags
      const choice = await pickPlatform(this.runsc, features.platforms, this.options.platform)
      this.runsc.platform = choice.platform
      if (choice.reason) this.logger.warn({ reason: choice.reason }, 'gVisor runs on ptrace')
      this.chosenPlatform = choice
      return choice
    })()
    return this.platformChoice
  }

  /** The platform chosen so far (`choosePlatform`), with the reason when it is not the fastest. */
  get platform(): { name: string; reason?: string | undefined } {
    return { name: this.runsc.platform, reason: this.chosenPlatform?.reason }
  }

  private prepare(): Promise<void> {
    this.prepared ??= (async () => {
      const availability = await this.availability()
      if (!availability.ok) {
        throw new CairnProblem('unavailable', `gVisor cannot run on this node: ${availability.reason}`, {
          driver: this.name,
        })
      }
      await this.choosePlatform()
      await mkdir(this.options.stateDir, { recursive: true })
      await chmod(this.options.stateDir, 0o711)
      await prepareRootfs(this.rootfsDir, this.options.etcDir)
      await mkdir(path.join(this.rootfsDir, path.dirname(STATX_SHIM_PATH)), { recursive: true, mode: 0o755 })
      this.statxShim = await installStatxShim(this.rootfsDir)
      for (const dir of [this.runsc.root, this.bundlesDir]) {
        await mkdir(dir, { recursive: true })
        await chmod(dir, 0o700)
      }
    })()
    // A failed preparation (runsc missing) is retried by the next start, after an install.
    this.prepared.catch(() => {
      this.prepared = undefined
    })
    return this.prepared
  }

  private specOptions(): GvisorSpecOptions {
    return {
      rootfsDir: this.rootfsDir,
      kitDir: this.options.kitDir,
      hostUid: this.options.hostUid,
      hostGid: this.options.hostGid,
    }
  }

  /**
   * The spec options of a sandbox on the image `rootfs`: the statx shim is bound into it when it
   * has the mount points (images built since the shim's binds; gVisor's gofer cannot make them in
   * the read-only image) and an empty /etc/ld.so.preload of its own (an image's own preloads win).
   */
  private async imageSpecOptions(rootfs: string): Promise<GvisorSpecOptions> {
    const options = this.specOptions()
    if (!this.statxShim) return options
    const [library, preload] = await Promise.all(
      [STATX_SHIM_PATH, STATX_PRELOAD_PATH].map((p) => lstat(path.join(rootfs, p)).catch(() => undefined)),
    )
    if (!library?.isFile() || !preload?.isFile() || preload.size > 0) return options
    return {
      ...options,
      imageStatxShim: {
        library: path.join(this.rootfsDir, STATX_SHIM_PATH),
        preload: path.join(this.rootfsDir, STATX_PRELOAD_PATH),
      },
    }
  }

  /** The OCI config.json of a sandbox (exposed for tests and for `cairn` diagnostics). */
  buildSpec(spec: SandboxSpec, options: GvisorSpecOptions = this.specOptions()): Record<string, unknown> {
    return buildOciSpec(spec, options)
  }

  /** What the sandbox's cgroup allows: the agent's limits plus the share of gVisor's machinery. */
  private hostLimits(spec: SandboxSpec): CgroupLimits {
    const { memoryOverheadMiB, pidsOverhead } = this.options
    return {
      memoryBytes:
        (spec.limits.memoryMiB + (memoryOverheadMiB ?? DEFAULT_GVISOR_MEMORY_OVERHEAD_MIB)) * 1024 * 1024,
      pids:
        this.runsc.platform === 'systrap'
          ? spec.limits.pids * SYSTRAP_HOST_TASKS.perTask + (pidsOverhead ?? SYSTRAP_HOST_TASKS.overhead)
          : spec.limits.pids * GVISOR_HOST_TASKS_PER_TASK + (pidsOverhead ?? DEFAULT_GVISOR_PIDS_OVERHEAD),
      cpus: spec.limits.cpus,
    }
  }

  /** Boots pool slots for the common layout (no extra binds, no network) in the background. */
  async prewarm(): Promise<void> {
    if (!this.pool) return
    await this.prepare()
    this.pool.warm({ network: 'none', binds: [] })
  }

  /** Pool claims and misses so far, and where the last claim's time went (for the bench). */
  get poolStats(): {
    claimed: number
    missed: number
    failed: number
    lastFailure: string | undefined
    lastClaim: ClaimTiming | undefined
  } {
    return {
      ...(this.pool?.counts ?? { claimed: 0, missed: 0, failed: 0 }),
      lastFailure: this.pool?.lastFailure,
      lastClaim: this.pool?.lastClaim,
    }
  }

  /** How many pre-started sandboxes are ready to be claimed. */
  get pooled(): number {
    return this.pool?.size() ?? 0
  }

  async start(spec: SandboxSpec): Promise<Sandbox> {
    if (spec.command.length === 0) throw new CairnProblem('bad_request', 'empty sandbox command')
    await this.prepare()
    // Pool slots are booted on the host's root: a sandbox with an image starts cold; so does one
    // that may be checkpointed (a slot runs under its own container id and root, which `runsc
    // checkpoint` of the session's sandbox does not find: "loading container: file does not exist").
    const claimed = spec.rootfs || spec.checkpointable ? undefined : await this.pool?.claim(spec)
    if (claimed) return claimed
    const sandbox = await this.launch(spec, ['run'])
    // The next session with this layout need not wait for a boot.
    if (!spec.rootfs) this.pool?.warm(spec)
    return sandbox
  }

  /**
   * Writes the running sandbox's memory and processes to `imageDir` (`runsc checkpoint`); the
   * sandbox ends with it and is to be destroyed. `restore` brings it back, on this node or after a
   * restart, with the same mounts (a cold start's layout: pool slots are not restored into).
   */
  async checkpoint(sandbox: Sandbox, imageDir: string): Promise<{ bytes: number }> {
    await this.prepare()
    return checkpointGvisor(sandbox, this.runsc, imageDir)
  }

  /**
   * A sandbox restored from `checkpoint`'s image instead of booted: its processes go on where they
   * were. Into the target `prepareRestore` booted for `spec.id` when there is one of the same
   * layout (its image loaded into a running sandbox: no boot on the path); a target that cannot
   * take it is destroyed and the sandbox is booted by `runsc restore` as without one.
   */
  async restore(spec: SandboxSpec, imageDir: string): Promise<Sandbox> {
    await this.prepare()
    const target = this.targets?.take(spec.id)
    if (target) {
      const sandbox = await this.restoreInto(target, spec, imageDir).catch(async (error: unknown) => {
        this.logger.warn(
          { err: error, sandboxId: spec.id },
          'restore into a pre-started target failed; booting',
        )
        await this.targets?.drop(spec.id, target)
        return undefined
      })
      if (sandbox) return sandbox
    }
    const sandbox = await this.launch(spec, restoreArgs(imageDir))
    await restored(sandbox, this.runsc).catch(async (error: unknown) => {
      await sandbox.destroy()
      throw error
    })
    return sandbox
  }

  private async restoreInto(target: RestoreTarget, spec: SandboxSpec, imageDir: string): Promise<Sandbox> {
    const layout = await this.layoutOf(spec)
    if (layoutKey(layout.config) !== target.layout)
      throw new Error('the restore target was booted for another layout')
    this.options.cgroups.setLimits(spec.id, this.hostLimits(layout.spec))
    const restore = [
      ...this.runscCommand(layout.flags),
      ...restoreArgs(imageDir),
      '--bundle',
      layout.bundle,
      spec.id,
    ]
    target.commandPipe.end(`${restore.join('\0')}\0`)
    await restored(target.sandbox, this.runsc)
    return target.sandbox
  }

  /**
   * Boots the sandbox a later `restore(spec, …)` of the same layout loads its image into (`runsc
   * create`, nothing run in it), so that restore does not wait for a boot; a no-op without room for
   * targets. It is destroyed by `dropRestoreTarget`, after `RESTORE_TARGET_TTL_MS`, or to make room.
   */
  async prepareRestore(spec: SandboxSpec): Promise<void> {
    if (!this.targets) return
    await this.prepare()
    const { layout, procsFiles } = await this.setUp(spec)
    const create = [...this.runscCommand(layout.flags), 'create', '--bundle', layout.bundle, spec.id]
    const child = spawn(LAUNCHER_SHELL, restoreTargetLauncherArgs(procsFiles, create), {
      stdio: ['pipe', 'pipe', 'pipe', 'ignore', 'pipe'],
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
      ...OWN_PROCESS_GROUP,
    }) as ChildProcessWithoutNullStreams
    const commandPipe = child.stdio[4] as Duplex | null | undefined
    child.on('error', () => undefined)
    commandPipe?.on('error', () => undefined)
    const sandbox = this.sandboxOf(spec.id, child, layout.bundle)
    const booted =
      child.pid !== undefined &&
      commandPipe &&
      (await Promise.race([
        launcherReady({ child, commandPipe }),
        new Promise<false>((r) => setTimeout(() => r(false), RESTORE_TARGET_BOOT_MS).unref()),
      ]))
    if (!booted || !commandPipe) {
      await sandbox.destroy()
      throw new CairnProblem(
        'sandbox_failed',
        `runsc create of a restore target failed or took over ${RESTORE_TARGET_BOOT_MS / 1000} s`,
        { driver: this.name },
      )
    }
    commandPipe.pause()
    await this.targets?.add(spec.id, { sandbox, commandPipe, layout: layoutKey(layout.config) })
  }

  /** Destroys the restore target booted for container `sandboxId`, if there is one. */
  async dropRestoreTarget(sandboxId: string): Promise<void> {
    await this.targets?.drop(sandboxId)
  }

  /** How many restore targets are kept. */
  get restoreTargets(): number {
    return this.targets?.size ?? 0
  }

  private runscCommand(flags: readonly string[]): string[] {
    return [this.runsc.path, '--root', this.runsc.root, ...flags]
  }

  /** The sandbox's bundle as it would be written: the spec run (behind the stdin relay), flags, config. */
  private async layoutOf(given: SandboxSpec) {
    // A sandbox that may be checkpointed reads its stdin through a relay inside it (see
    // stdinRelayCommand): the same command for `run` and `restore`, whose bundles must match.
    const spec = given.checkpointable ? { ...given, command: stdinRelayCommand(given.command) } : given
    const flags = spec.rootfs ? imageRunscFlags(this.runsc) : runscFlags(this.runsc)
    if (!flags)
      throw new CairnProblem(
        'sandbox_failed',
        'this runsc release has no --overlay2, which a writable root that resets needs: run agents with an image under bwrap, or upgrade runsc',
      )
    const config = this.buildSpec(spec, spec.rootfs ? await this.imageSpecOptions(spec.rootfs) : undefined)
    return { spec, flags, config, bundle: path.join(this.bundlesDir, spec.id) }
  }

  /** Writes the sandbox's bundle and makes its cgroups (their cgroup.procs files returned). */
  private async setUp(given: SandboxSpec) {
    const layout = await this.layoutOf(given)
    await mkdir(layout.bundle, { recursive: true })
    await writeFile(path.join(layout.bundle, 'config.json'), JSON.stringify(layout.config), { mode: 0o600 })
    const procsFiles = await this.options.cgroups.create(given.id, this.hostLimits(layout.spec))
    return { layout, procsFiles }
  }

  private sandboxOf(id: string, child: ChildProcessWithoutNullStreams, bundle: string): GvisorSandbox {
    return new GvisorSandbox(id, child.pid ?? -1, childIo(child), childEnd(child), {
      cgroups: this.options.cgroups,
      name: id,
      runsc: this.runsc,
      bundle,
      logger: this.logger,
    })
  }

  /** `runsc run` (or `restore`) of a sandbox of its own, inside its cgroups from the start. */
  private async launch(given: SandboxSpec, subcommand: readonly string[]): Promise<Sandbox> {
    const { layout, procsFiles } = await this.setUp(given)
    const runscArgs = [...this.runscCommand(layout.flags), ...subcommand, '--bundle', layout.bundle, given.id]
    // As in the bwrap driver (launcher.ts): close what was inherited, join the cgroups as root, then
    // become runsc, so the gofer, the sentry and the agent's ptrace stubs are all inside the
    // sandbox's cgroups from their first instruction.
    const child = spawn(LAUNCHER_SHELL, launcherArgs(2, procsFiles, runscArgs), {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
      ...OWN_PROCESS_GROUP,
    })
    if (child.pid === undefined) {
      await this.options.cgroups.remove(given.id)
      await rm(layout.bundle, { recursive: true, force: true })
      throw new CairnProblem('sandbox_failed', 'could not start the gVisor sandbox launcher')
    }
    return this.sandboxOf(given.id, child, layout.bundle)
  }

  async reapOrphans(): Promise<number> {
    await this.pool?.close()
    await this.targets?.close()
    // A sandbox left frozen (a crash during a snapshot) makes runsc commands, `list` included,
    // wait for it forever: thaw every sandbox cgroup of this instance before asking runsc.
    // A thaw that fails leaves runsc to time out on that sandbox only; the kill below ends it anyway.
    for (const name of await this.options.cgroups.list()) {
      await this.options.cgroups
        .freeze(name, false)
        .catch(logAndGoOn(this.logger, 'warn', { cgroup: name }, 'could not thaw an orphan sandbox'))
    }
    // Without runsc's list (runsc gone or broken) no container is known to delete: their cgroups are
    // still killed and removed by the bwrap driver's reaping of the shared scope, so it is reported.
    const containers = await listContainers(this.runsc).catch((err: unknown) => {
      this.logger.warn({ err }, 'runsc list failed; orphan gVisor containers are not deleted')
      return []
    })
    for (const container of containers) {
      // Each step is tried whatever the one before did: a container whose cgroup is gone still has
      // runsc state to delete, and `remove` below says whether the cgroup stays.
      await this.options.cgroups
        .kill(container.id)
        .catch(
          logAndGoOn(this.logger, 'debug', { sandboxId: container.id }, 'could not kill an orphan sandbox'),
        )
      await runsc(this.runsc, ['delete', '--force', container.id]).catch(
        logAndGoOn(this.logger, 'warn', { sandboxId: container.id }, 'runsc delete of an orphan failed'),
      )
      await this.options.cgroups.remove(container.id)
    }
    await cleanupSlots(this.slotsDir, this.logger)
    if (existsSync(this.bundlesDir)) await rm(this.bundlesDir, { recursive: true, force: true })
    this.prepared = undefined
    this.pool?.reopen()
    // Pool slots are not sessions' sandboxes: they are reaped, not counted.
    return containers.filter((c) => !c.id.startsWith(POOL_SLOT_PREFIX)).length
  }

  async close(): Promise<void> {
    await this.pool?.close()
    await this.targets?.close()
    await cleanupSlots(this.slotsDir, this.logger)
    await rm(this.options.stateDir, { recursive: true, force: true })
    this.prepared = undefined
  }
}

/** How long `runsc create` of a restore target may take before the pause goes on without it. */
const RESTORE_TARGET_BOOT_MS = 30_000

/** What a restore target must share with the restore: its bundle but for the process run in it. */
function layoutKey(config: Record<string, unknown>): string {
  return JSON.stringify({ ...config, process: undefined })
}

async function runscAvailability(runscPath: string): Promise<GvisorAvailability> {
  const binary = findBinary(runscPath)
  if (!binary) return { ok: false, reason: `${runscPath} is not installed (apt-get install runsc)` }
  const version = await runscVersion(binary)
  if (!version) return { ok: false, reason: `${binary} --version failed` }
  return { ok: true, version }
}

/** Whether gVisor really runs on this host: runsc is installed and a throwaway sandbox starts. */
export async function probeGvisor(
  config: Pick<RunscConfig, 'path' | 'platform'> = { path: 'runsc', platform: 'ptrace' },
): Promise<GvisorAvailability> {
  const availability = await runscAvailability(config.path)
  if (!availability.ok) return availability
  const run = await runscSelfTest(config)
  return run.ok ? availability : { ok: false, reason: run.reason }
}

export interface PlatformChoice {
  platform: string
  /** Why the platform is ptrace on a runsc that offers systrap (its probe failed). */
  reason?: string | undefined
  /** A throwaway sandbox started on it while choosing. */
  started?: true
}

/**
 * The operator's platform when named; else systrap where the release offers it and a throwaway
 * sandbox starts on it (seccomp-based stubs need a host that lets them trap), else ptrace.
 */
export async function pickPlatform(
  config: Pick<RunscConfig, 'path'>,
  platforms: readonly string[],
  named: string | undefined,
): Promise<PlatformChoice> {
  if (named !== undefined) return { platform: named }
  const fastest = defaultPlatform(platforms)
  if (fastest === 'ptrace') return { platform: 'ptrace' }
  const probe = await runscSelfTest({ path: findBinary(config.path) ?? config.path, platform: fastest })
  if (probe.ok) return { platform: fastest, started: true }
  return { platform: 'ptrace', reason: `${fastest} did not start a sandbox here: ${probe.reason}` }
}
