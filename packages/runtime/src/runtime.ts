import { existsSync } from 'node:fs'
import { chmod, cp, mkdir, rm, rmdir, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { AgentProcess } from './agent/agent-process.js'
import type { AgentLaunch } from './agent/types.js'
import { EgressCa } from './egress/egress-ca.js'
import { AGENT_KIT_DIR, instanceRunDir, instanceStderrDir } from './paths.js'
import { DEFAULT_RESIDENT_BOUNDS, type ResidentBounds } from './port/resident-bounds.js'
import { BwrapDriver } from './sandbox/bwrap-driver.js'
import { CgroupManager } from './sandbox/cgroups.js'
import type { DriverCapabilities, IsolationName, SandboxDriver } from './sandbox/driver.js'
import { type GvisorAvailability, GvisorDriver } from './sandbox/gvisor-driver.js'
import { generatedEtcFiles } from './sandbox/rootfs.js'
import { DEFAULT_SANDBOX_UID_RANGE } from './sandbox/sandbox-uids.js'
import { BtrfsPool } from './storage/btrfs-pool.js'
import { DirPool } from './storage/dir-pool.js'
import type { StorageDriverName, StoragePool } from './storage/pool.js'
import { execTool } from './util/exec.js'
import { type Logger, noopLogger } from './util/logger.js'
import { readMounts } from './util/mounts.js'

export interface RuntimeOptions {
  dataDir: string
  /**
   * The workspace store: `btrfs` (default; O(1) snapshots, quotas) or `dir` (plain directories,
   * copies with `cp -a`, for hosts where btrfs is not possible).
   */
  storage?: StorageDriverName | undefined
  /**
   * btrfs: an existing btrfs directory instead of a loop-mounted image under the data dir.
   * dir: the directory that holds the trees (default `<data dir>/pool`).
   */
  poolPath?: string | undefined
  poolImageSizeBytes?: number | undefined
  /** Unprivileged host uid/gid that owns workspaces and builds on disk. */
  sandboxUid?: number | undefined
  /**
   * bwrap: a host uid per sandbox from this range, seeing its files through idmapped mounts
   * (default `DEFAULT_SANDBOX_UID_RANGE`; `false`: every sandbox runs as `sandboxUid`).
   */
  sandboxUidRange?: { first: number; count: number } | false | undefined
  /** Size limit of each session workspace, enforced with btrfs quota groups (off when unset). */
  workspaceQuotaBytes?: number | undefined
  /** Limit of what each tenant's trees hold together (btrfs quota groups; off when unset). */
  tenantQuotaBytes?: number | undefined
  /** Pool space kept free for Cairn's own writes when quotas are on (default: see `defaultReserveBytes`). */
  poolReserveBytes?: number | undefined
  /** What the shared agent images may hold together (default: half of what agents' trees may use). */
  imagesQuotaBytes?: number | undefined
  /** Base of per-instance runtime directories (default /run/cairn). */
  runBase?: string | undefined
  /** The sandbox driver of agents that do not choose one (`AgentLaunch.isolation`); default bwrap. */
  isolation?: IsolationName | undefined
  /**
   * gVisor settings: the runsc binary, its platform (default `ptrace`) and how many sandboxes to
   * keep booted ahead per mount layout (default 2 when gVisor is the default isolation, else 0).
   */
  /**
   * bwrap launchers kept ready in fresh cgroups, so a cold start skips the cgroup migration (an
   * RCU grace period) and the fork of the server (default 0: none; the server keeps 2).
   */
  spareLaunchers?: number | undefined
  gvisor?:
    | {
        runscPath?: string | undefined
        platform?: string | undefined
        poolSize?: number | undefined
        /** Restore targets kept at most (`GvisorDriverOptions.restoreTargets`). */
        restoreTargets?: number | undefined
      }
    | undefined
  /**
   * Resident pauses: `pause: memory` sandboxes frozen in place when keep-warm ends, at most `max`
   * per node, each for at most `idleMs` (default `DEFAULT_RESIDENT_BOUNDS`; env
   * `CAIRN_RESIDENT_PAUSES`, `CAIRN_RESIDENT_PAUSE_MS`); 0 turns them off.
   */
  residentPauses?: { max?: number | undefined; idleMs?: number | undefined } | undefined
  /** Where the runtime reports what it recovers from (the server passes its pino logger); default none. */
  logger?: Logger | undefined
}

/** One sandbox driver of this node, as `GET /v1/runtime` reports it. */
export interface IsolationInfo {
  name: IsolationName
  default: boolean
  available: boolean
  /** Why the driver cannot run here, when it cannot. */
  reason?: string | undefined
  capabilities: DriverCapabilities
  /** Why a capability the driver lacks cannot be had here, where that is known. */
  capabilityReasons?: Partial<Record<keyof DriverCapabilities, string>> | undefined
  /** gVisor's platform (systrap, ptrace, kvm) and why it is not the fastest the release offers. */
  platform?: string | undefined
  platformReason?: string | undefined
  description: string
}

export const DEFAULT_SANDBOX_UID = 61000
export const DEFAULT_POOL_IMAGE_BYTES = 20 * 1024 * 1024 * 1024

/**
 * One machine's worker: the storage pool, the sandbox driver and the agent processes. The server
 * talks to it in-process through this class; a remote runtime would expose the same methods.
 */
export class Runtime {
  readonly pool: StoragePool
  /** The default driver (`isolation`); `drivers` holds every driver of this node. */
  readonly driver: SandboxDriver
  readonly drivers: Readonly<Record<IsolationName, SandboxDriver>>
  readonly runDir: string
  /** Where the agents' stderr files go (`instanceStderrDir`). */
  readonly stderrDir: string
  /** An empty root-owned directory (see `persistLaunch`). */
  get emptyDir(): string {
    return path.join(this.runDir, 'empty')
  }
  private readonly cgroups: CgroupManager
  private readonly gvisor: GvisorDriver
  private gvisorProbe: Promise<GvisorAvailability> | undefined
  private readonly agents = new Set<AgentProcess>()
  private egressCaLoad: Promise<EgressCa> | undefined
  readonly logger: Logger

  constructor(readonly options: RuntimeOptions) {
    this.logger = options.logger ?? noopLogger
    this.runDir = instanceRunDir(options.dataDir, options.runBase)
    this.stderrDir = instanceStderrDir(this.runDir)
    const uid = options.sandboxUid ?? DEFAULT_SANDBOX_UID
    const poolOptions = {
      mountPoint: path.join(this.runDir, 'pool'),
      sandboxUid: uid,
      sandboxGid: uid,
      workspaceQuotaBytes: options.workspaceQuotaBytes,
      tenantQuotaBytes: options.tenantQuotaBytes,
      reserveBytes: options.poolReserveBytes,
      imagesQuotaBytes: options.imagesQuotaBytes,
    }
    this.pool =
      options.storage === 'dir'
        ? new DirPool({ ...poolOptions, storePath: options.poolPath ?? path.join(options.dataDir, 'pool') })
        : new BtrfsPool({
            ...poolOptions,
            imagePath: path.join(options.dataDir, 'pool.img'),
            imageSizeBytes: options.poolImageSizeBytes ?? DEFAULT_POOL_IMAGE_BYTES,
            existingPath: options.poolPath,
          })
    this.cgroups = new CgroupManager(`cairn/${path.basename(this.runDir)}`, this.logger)
    const bwrap = new BwrapDriver({
      logger: this.logger,
      cgroups: this.cgroups,
      hostUid: uid,
      hostGid: uid,
      etcDir: path.join(this.runDir, 'etc'),
      kitDir: path.join(this.runDir, 'kit'),
      overlayDir: path.join(this.runDir, 'overlays'),
      sandboxUids:
        options.sandboxUidRange === false
          ? undefined
          : {
              ...(options.sandboxUidRange ?? DEFAULT_SANDBOX_UID_RANGE),
              idmapDir: path.join(this.runDir, 'idmap'),
            },
      spareLaunchers: options.spareLaunchers ?? 0,
    })
    // Both drivers share the instance's cgroup scope, so every sandbox is counted and reaped alike.
    this.gvisor = new GvisorDriver({
      logger: this.logger,
      cgroups: this.cgroups,
      hostUid: uid,
      hostGid: uid,
      etcDir: path.join(this.runDir, 'etc'),
      kitDir: path.join(this.runDir, 'kit'),
      stateDir: path.join(this.runDir, 'gvisor'),
      // The environment names another runsc release or platform (to compare them, in benches).
      runscPath: options.gvisor?.runscPath ?? process.env.CAIRN_RUNSC,
      platform: options.gvisor?.platform ?? process.env.CAIRN_GVISOR_PLATFORM,
      poolSize: options.gvisor?.poolSize ?? (options.isolation === 'gvisor' ? 2 : 0),
      // CAIRN_GVISOR_RESTORE_TARGETS=0: every restore boots its sandbox (the bench's "before").
      restoreTargets:
        options.gvisor?.restoreTargets ??
        (process.env.CAIRN_GVISOR_RESTORE_TARGETS
          ? Number(process.env.CAIRN_GVISOR_RESTORE_TARGETS)
          : undefined),
    })
    this.drivers = { bwrap, gvisor: this.gvisor }
    this.driver = this.drivers[options.isolation ?? 'bwrap']
  }

  /** This node's bounds on resident pauses (`RuntimeOptions.residentPauses`). */
  get residentBounds(): ResidentBounds {
    const given = this.options.residentPauses
    const env = (name: string) => (process.env[name] ? Number(process.env[name]) : undefined)
    return {
      max: given?.max ?? env('CAIRN_RESIDENT_PAUSES') ?? DEFAULT_RESIDENT_BOUNDS.max,
      idleMs: given?.idleMs ?? env('CAIRN_RESIDENT_PAUSE_MS') ?? DEFAULT_RESIDENT_BOUNDS.idleMs,
    }
  }

  /**
   * What `driver` can do on this node and why not the rest: its own capabilities, resident
   * pauses off where the node keeps none frozen.
   */
  capabilitiesOf(driver: SandboxDriver): Pick<IsolationInfo, 'capabilities' | 'capabilityReasons'> {
    const { max, idleMs } = this.residentBounds
    const residentOff = driver.capabilities.residentPause && !(max > 0 && idleMs > 0)
    const reasons = {
      ...driver.unavailableBecause,
      ...(residentOff
        ? {
            residentPause: `this node keeps no sandbox frozen (resident pauses at most ${max}, for ${idleMs} ms: CAIRN_RESIDENT_PAUSES, CAIRN_RESIDENT_PAUSE_MS)`,
          }
        : {}),
    }
    return {
      capabilities: {
        ...driver.capabilities,
        residentPause: driver.capabilities.residentPause && !residentOff,
      },
      ...(Object.keys(reasons).length > 0 ? { capabilityReasons: reasons } : {}),
    }
  }

  /** The driver for an agent's `isolation`, or the default one. */
  driverFor(isolation?: IsolationName | undefined): SandboxDriver {
    return isolation ? this.drivers[isolation] : this.driver
  }

  /** Every driver of this node: whether it can run here and what it can do. */
  async isolations(): Promise<IsolationInfo[]> {
    // A real sandbox start, once: an installed runsc can still fail on this host's kernel.
    this.gvisorProbe ??= this.gvisor.selfTest()
    const gvisorState = await this.gvisorProbe
    return (Object.entries(this.drivers) as [IsolationName, SandboxDriver][]).map(([name, driver]) => ({
      name,
      default: driver === this.driver,
      available: name === 'gvisor' ? gvisorState.ok : true,
      ...(name === 'gvisor' && !gvisorState.ok ? { reason: gvisorState.reason } : {}),
      ...this.capabilitiesOf(driver),
      ...(driver === this.gvisor && gvisorState.ok ? gvisorPlatform(this.gvisor) : {}),
      description: driver.describe(),
    }))
  }

  /** Prepares directories, mounts the pool and reaps sandboxes a crashed predecessor left. */
  async open(): Promise<{ orphansReaped: number }> {
    // Refused before anything is created, so a failed start leaves nothing behind.
    const { workspaceQuotaBytes, tenantQuotaBytes } = this.options
    if ((workspaceQuotaBytes || tenantQuotaBytes) && !this.pool.capabilities.quotas) {
      throw new CairnProblem(
        'unavailable',
        `workspace and tenant quotas need the btrfs storage driver; the ${this.pool.driver} driver cannot limit a workspace`,
      )
    }
    await this.refusePoolMountedElsewhere()
    await mkdir(this.runDir, { recursive: true })
    // Safe to go on: the run base may belong to someone else (a shared /run/cairn); sandboxes then
    // reach their files only if its mode already lets them, which the first start fails loudly on.
    await chmod(path.dirname(this.runDir), 0o711).catch((error: unknown) =>
      this.logger.warn(
        { err: error, runBase: path.dirname(this.runDir) },
        'could not open up the run base (0711)',
      ),
    )
    await chmod(this.runDir, 0o711)
    const etcDir = path.join(this.runDir, 'etc')
    await mkdir(etcDir, { recursive: true })
    await chmod(etcDir, 0o755)
    for (const [name, body] of Object.entries(generatedEtcFiles())) {
      await writeFile(path.join(etcDir, name), body, { mode: 0o644 })
    }
    // Mounted read-only over /workspace/.cairn-persist in sandboxes with persisted paths.
    await mkdir(this.emptyDir, { recursive: true })
    await chmod(this.emptyDir, 0o555)
    const kitDir = path.join(this.runDir, 'kit')
    await rm(kitDir, { recursive: true, force: true })
    await cp(AGENT_KIT_DIR, kitDir, {
      recursive: true,
      // Judged relative to the kit, so a checkout under e.g. ~/src/ still copies everything.
      filter: (src) => {
        const rel = path.relative(AGENT_KIT_DIR, src).split(path.sep)
        return !rel.includes('node_modules') && rel[0] !== 'src' && !src.endsWith('.tsbuildinfo')
      },
    })
    await execTool('chmod', ['-R', 'a+rX', kitDir])
    const sandboxesDir = path.join(this.runDir, 'sandboxes')
    await rm(sandboxesDir, { recursive: true, force: true })
    await mkdir(sandboxesDir, { recursive: true })
    await chmod(sandboxesDir, 0o711)
    if (this.stderrDir !== sandboxesDir) {
      await rm(this.stderrDir, { recursive: true, force: true })
      await mkdir(this.stderrDir, { recursive: true, mode: 0o700 })
    }
    if (this.driver instanceof GvisorDriver) {
      const state = await this.driver.availability()
      if (!state.ok) {
        throw new CairnProblem('unavailable', `the default isolation gvisor cannot run: ${state.reason}`)
      }
    }
    // gVisor first: it knows its containers; bwrap's reaping then takes whatever cgroup is left.
    let orphansReaped = await this.drivers.gvisor.reapOrphans()
    orphansReaped += await this.drivers.bwrap.reapOrphans()
    await this.pool.open()
    // Best effort: without a ready slot a gVisor sandbox boots on demand, and says why it cannot.
    await this.gvisor
      .prewarm()
      .catch((error: unknown) =>
        this.logger.warn({ err: error }, 'gVisor prewarm failed; sandboxes boot on demand'),
      )
    return { orphansReaped }
  }

  /**
   * The pool image mounted anywhere but this instance's own mount point belongs to another server
   * (or one killed while it ran from another path): mounting it a second time, or reaping and
   * reconciling against it, would wreck it. Checked before anything is touched.
   */
  private async refusePoolMountedElsewhere(): Promise<void> {
    if (this.options.storage === 'dir' || this.options.poolPath !== undefined) return
    const image = path.join(this.options.dataDir, 'pool.img')
    if (!existsSync(image)) return
    const { stdout } = await execTool('losetup', ['--associated', image], { code: 'storage_error' })
    const loops = new Set(stdout.split('\n').flatMap((line) => (line ? [line.split(':')[0] as string] : [])))
    // Mounts beneath this instance's own run dir (a sandbox's idmapped workspace, a gVisor slot's
    // binds) are what a killed predecessor on this data dir left: reaping removes them below.
    const own = (mountPoint: string) => mountPoint.startsWith(`${this.runDir}/`)
    const elsewhere = readMounts().find(
      (m) => loops.has(m.source) && m.mountPoint !== this.pool.root && !own(m.mountPoint),
    )
    if (elsewhere) {
      throw new CairnProblem(
        'conflict',
        `the storage pool ${image} is already mounted at ${elsewhere.mountPoint} (${elsewhere.source}), by another Cairn server or one that died; stop that server, or unmount it (umount ${elsewhere.mountPoint}) if none runs`,
        { poolImage: image, mountPoint: elsewhere.mountPoint },
      )
    }
  }

  async startAgent(launch: AgentLaunch): Promise<AgentProcess> {
    const agent = new AgentProcess(
      this.driverFor(launch.isolation),
      launch,
      path.join(this.runDir, 'sandboxes'),
      () => this.egressCa(),
      this.logger,
      this.stderrDir,
    )
    this.agents.add(agent)
    try {
      await agent.start()
    } catch (error) {
      this.agents.delete(agent)
      await agent.stop()
      throw error
    }
    return agent
  }

  /** The per-install CA of the egress proxy, under the data dir; made on first use. */
  egressCa(): Promise<EgressCa> {
    if (!this.egressCaLoad) {
      this.egressCaLoad = EgressCa.load(path.join(this.options.dataDir, 'egress-ca'))
      this.egressCaLoad.catch(() => {
        this.egressCaLoad = undefined
      })
    }
    return this.egressCaLoad
  }

  async stopAgent(agent: AgentProcess): Promise<void> {
    this.agents.delete(agent)
    await agent.stop()
  }

  /**
   * The running agent of a session on this machine (for the machine's own checks and attack tests;
   * the server asks the port, which answers by ID).
   */
  agentOf(sessionId: string): AgentProcess | undefined {
    for (const agent of this.agents) if (agent.sessionId === sessionId && agent.alive) return agent
    return undefined
  }

  get warmCount(): number {
    return this.agents.size
  }

  async close(): Promise<void> {
    await Promise.all([...this.agents].map((agent) => agent.stop()))
    this.agents.clear()
    for (const driver of [this.drivers.gvisor, this.drivers.bwrap]) {
      await driver.reapOrphans()
      await driver.close()
    }
    await this.pool.close()
    for (const name of ['sandboxes', 'kit', 'etc']) {
      await rm(path.join(this.runDir, name), { recursive: true, force: true })
    }
    await rm(this.stderrDir, { recursive: true, force: true })
    const under = `${this.runDir}/`
    // The directory every instance's stderr dir is made in, once no other instance has one there.
    if (!this.stderrDir.startsWith(under)) await rmdir(path.dirname(this.stderrDir)).catch(() => {})
    // rmdir, never rm -r, while anything is still mounted there (the pool, should its unmount have
    // failed): its data must stay untouched. Otherwise the whole run dir goes, whatever any part
    // of the server kept in it (agent memory, gVisor state …): a stopped server leaves nothing.
    if (readMounts().some((m) => m.mountPoint === this.runDir || m.mountPoint.startsWith(under))) {
      // Expected to fail while something is still mounted below: rmdir only removes empty dirs.
      const keep = (error: unknown) =>
        this.logger.warn({ err: error, runDir: this.runDir }, 'left the run dir in place: still mounted')
      await rmdir(this.pool.root).catch(keep)
      await rmdir(this.runDir).catch(keep)
    } else {
      await rm(this.runDir, { recursive: true, force: true })
    }
  }
}

/** The platform fields of gVisor's entry in `isolations` (once its self-test chose one). */
function gvisorPlatform(driver: GvisorDriver): Pick<IsolationInfo, 'platform' | 'platformReason'> {
  const { name, reason } = driver.platform
  return { platform: name, ...(reason ? { platformReason: reason } : {}) }
}
