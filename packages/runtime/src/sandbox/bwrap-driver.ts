import type { ChildProcess } from 'node:child_process'
import { type FileHandle, mkdir, open, rename, rm, stat, writeFile } from 'node:fs/promises'
import path from 'node:path'
import type { Duplex, Readable } from 'node:stream'
import { CairnProblem } from '@cairn/protocol'
import { NETNS_SETUP, nftAvailable } from '../egress/transparent.js'
import { sandboxNetworkPid } from '../ports/listening-ports.js'
import { execTool } from '../util/exec.js'
import { type Logger, logAndGoOn, noopLogger } from '../util/logger.js'
import { readMounts } from '../util/mounts.js'
import { dirtiedBytes } from '../util/proc-io.js'
import type { CgroupLimits, CgroupManager } from './cgroups.js'
import type {
  DriverCapabilities,
  Sandbox,
  SandboxDriver,
  SandboxExecProcess,
  SandboxExecSpec,
  SandboxExit,
  SandboxSpec,
} from './driver.js'
import { type IdmapMount, IdmapMounter } from './idmap-mounter.js'
import { bwrapCommandStream, ENV_FD } from './launcher.js'
import { discardLauncher, LauncherPool, type SpareLauncher, startLauncher } from './launcher-pool.js'
import { OverlayMounter } from './overlay-mounter.js'
import { readOnlyRootArgs, SANDBOX_USER } from './rootfs.js'
import { sandboxEnv } from './sandbox-env.js'
import { execInSandbox } from './sandbox-exec.js'
import { SandboxUids } from './sandbox-uids.js'
import { buildSeccompFilter } from './seccomp.js'

export interface BwrapDriverOptions {
  cgroups: CgroupManager
  /** Where it reports the steps it goes on without (failed cleanups); default none. */
  logger?: Logger | undefined
  /**
   * The shared unprivileged host uid/gid: the owner of workspaces and builds on disk, and the uid
   * sandboxes run as when `sandboxUids` is off or idmapped mounts are not available here.
   */
  hostUid: number
  hostGid: number
  /**
   * A host uid per sandbox from this range (the inside uid 1000 maps to it), which sees its
   * workspace and binds through idmapped mounts made under `idmapDir`.
   */
  sandboxUids?: { first: number; count: number; idmapDir: string } | undefined
  /** Host directory with generated passwd/group/hosts. */
  etcDir: string
  /** Host directory mounted read-only at /opt/cairn (agent-kit shims and libraries). */
  kitDir: string
  /** Where the writable roots of sandboxes with an image are mounted (a tmpfs and overlay each). */
  overlayDir?: string | undefined
  bwrapPath?: string
  /**
   * Launchers kept ready in fresh cgroups (see `LauncherPool`), so a cold start skips the cgroup
   * migration and the server's fork; 0 (the default) starts each sandbox from scratch.
   */
  spareLaunchers?: number
}

/** How long after the sandbox's exit its output pipes may take to drain. */
const EXIT_DRAIN_MS = 1000

/**
 * Why bwrap sandboxes stop rather than pause with their memory (measured on the project's hosts
 * with Debian 13's CRIU 4.1.1: docs/architecture/pausing.md, "bwrap and CRIU 4.1.1").
 */
export const BWRAP_MEMORY_SNAPSHOT_REASON =
  "CRIU cannot checkpoint a bwrap sandbox: its user namespace maps only the agent's uid, and CRIU needs " +
  "the namespace's root mapped (Debian 13's CRIU 4.1.1: \"Unable to convert uid or gid\"; Debian 12's " +
  '3.17 does not start on kernels since 6.13, [vvar_vclock]; docs/architecture/pausing.md). Run the ' +
  'agent with `isolation: gvisor` for `pause: memory`.'

export class BwrapDriver implements SandboxDriver {
  readonly name = 'bwrap'
  readonly capabilities: DriverCapabilities = {
    freeze: true,
    network: false,
    memorySnapshot: false,
    residentPause: true,
    ports: true,
    transparentEgress: nftAvailable(),
  }
  readonly unavailableBecause = { memorySnapshot: BWRAP_MEMORY_SNAPSHOT_REASON }

  private readonly launchers: LauncherPool | undefined
  private readonly uids: SandboxUids | undefined
  private readonly mounter = new IdmapMounter()
  private readonly overlays = new OverlayMounter()
  /** Whether idmapped mounts work here (asked once; the reason when not). */
  private idmapCheck: Promise<string | undefined> | undefined
  private idmapUnavailable: string | undefined
  private readonly logger: Logger

  constructor(private readonly options: BwrapDriverOptions) {
    this.logger = options.logger ?? noopLogger
    const range = options.sandboxUids
    this.uids = range ? new SandboxUids(range.first, range.count) : undefined
    const size = options.spareLaunchers ?? 0
    this.launchers =
      size > 0 && LauncherPool.available()
        ? new LauncherPool({
            cgroups: options.cgroups,
            logger: this.logger,
            size,
            seccompFd: async () => (this.seccomp ? this.seccompFd() : undefined),
          })
        : undefined
  }

  describe(): string {
    const range = this.options.sandboxUids
    const uids =
      range && !this.idmapUnavailable
        ? `a host uid per sandbox from ${range.first}, files as uid ${this.options.hostUid} through idmapped mounts`
        : `host uid ${this.options.hostUid}${this.idmapUnavailable ? ` (no idmapped mounts: ${this.idmapUnavailable})` : ''}`
    return `bwrap (${uids}, ${this.options.cgroups.describe()})`
  }

  /**
   * Whether an idmapped mount can be made here (kernel 5.12+; btrfs since 5.15, tmpfs since 6.3),
   * tried once on the first sandbox's workspace, as read-only, and never attached. The check uses
   * the first uid of the range, so the first sandbox finds its user namespace made.
   */
  private checkIdmap(uid: number, source: string): Promise<string | undefined> {
    this.idmapCheck ??= this.mounter
      .check(source, { diskUid: this.options.hostUid, diskGid: this.options.hostGid, uid, gid: uid })
      .then(
        () => undefined,
        (error: Error) => error.message,
      )
    return this.idmapCheck
  }

  /**
   * The uid a sandbox runs as and the spec it runs with: its own uid, with the workspace and every
   * directory bind replaced by an idmapped mount of it (the shared uid's files shown as that uid),
   * made in the mount namespace of its launcher `pid`; or the shared uid and the spec as is.
   */
  private async identity(spec: SandboxSpec, pid: number): Promise<SandboxIdentity> {
    const { hostUid, hostGid, sandboxUids } = this.options
    const shared: SandboxIdentity = { uid: hostUid, gid: hostGid, spec, release: async () => undefined }
    if (!this.uids || !sandboxUids) return shared
    const base = sandboxUids.idmapDir
    await mkdir(base, { recursive: true, mode: 0o711 })
    this.idmapUnavailable = await this.checkIdmap(sandboxUids.first, spec.workspaceDir)
    if (this.idmapUnavailable) return shared
    const uids = this.uids
    const uid = uids.take()
    // The mounts go with the launcher's namespace, so with the sandbox's last process: only the
    // uid is left to free (once the sandbox is gone, it owns nothing).
    let released = false
    const release = async () => {
      if (!released) uids.release(uid)
      released = true
    }
    const mounts: IdmapMount[] = []
    const mapped = async (source: string, readOnly: boolean): Promise<string> => {
      // A file bind (not made today) keeps the shared uid's view.
      if (!(await stat(source)).isDirectory()) return source
      const point = path.join(base, spec.id, String(mounts.length))
      mounts.push({ source, point, readOnly })
      return point
    }
    try {
      const workspaceDir = await mapped(spec.workspaceDir, false)
      const binds = []
      for (const bind of spec.binds ?? [])
        binds.push({ ...bind, source: await mapped(bind.source, bind.readOnly) })
      // The image's files, the shared uid's on disk, shown as this sandbox's below its overlay.
      const rootfs = spec.rootfs ? await mapped(spec.rootfs, true) : undefined
      await this.mounter.mountIn(pid, base, { diskUid: hostUid, diskGid: hostGid, uid, gid: uid }, mounts)
      return { uid, gid: uid, spec: { ...spec, workspaceDir, binds, rootfs }, release }
    } catch (error) {
      await release()
      throw error
    }
  }

  /**
   * For a sandbox with an image: mounts its overlay (the image read-only below, a tmpfs of the
   * sandbox's own above, sized by its memory limit) in the mount namespace of its launcher `pid`
   * and makes it the spec's root; gone (and so emptied) with the sandbox.
   */
  private async writableRoot(identity: SandboxIdentity, pid: number): Promise<SandboxIdentity> {
    const { spec } = identity
    if (!spec.rootfs) return identity
    const overlayDir = this.options.overlayDir
    if (!overlayDir) {
      await identity.release()
      throw new CairnProblem(
        'sandbox_failed',
        'this driver was set up without a directory for writable roots',
      )
    }
    await mkdir(overlayDir, { recursive: true, mode: 0o711 })
    try {
      const dir = path.join(overlayDir, spec.id)
      const root = await this.overlays.mountIn(pid, overlayDir, dir, spec.rootfs, spec.limits.memoryMiB)
      return { ...identity, spec: { ...spec, rootfs: root } }
    } catch (error) {
      await identity.release()
      throw new CairnProblem(
        'sandbox_failed',
        `could not mount the sandbox's root: ${(error as Error).message}`,
      )
    }
  }

  /** The seccomp program (x86_64), written once to a file each sandbox reads through fd 3. */
  private readonly seccomp = buildSeccompFilter()
  private seccompFile: Promise<string> | undefined

  /** The seccomp program's file, written once (every concurrent first start waits for the one write). */
  private seccompPath(): Promise<string> {
    this.seccompFile ??= (async () => {
      const file = path.join(this.options.etcDir, 'seccomp.bpf')
      const tmp = `${file}.${process.pid}.tmp`
      await writeFile(tmp, this.seccomp ?? Buffer.alloc(0), { mode: 0o644 })
      await rename(tmp, file)
      return file
    })()
    return this.seccompFile
  }

  private async seccompFd(): Promise<FileHandle> {
    return open(await this.seccompPath(), 'r')
  }

  /**
   * The sandbox's environment as bwrap options (`--setenv NAME VALUE`…), which bwrap reads from
   * `ENV_FD` (`--args`), never from its command line: argv is in `/proc/PID/cmdline`, which every
   * local user can read, and the environment holds the runtime and setup secrets.
   */
  envArgs(spec: Pick<SandboxSpec, 'env'>): string[] {
    return Object.entries(sandboxEnv(spec)).flatMap(([key, value]) => ['--setenv', key, value])
  }

  /** `envArgs` as bwrap's `--args` reads them on `ENV_FD`: each NUL-terminated. */
  envStream(spec: Pick<SandboxSpec, 'env'>): string {
    return this.envArgs(spec)
      .map((arg) => `${arg}\0`)
      .join('')
  }

  /**
   * bwrap's command line for `spec`, run as host `uid`/`gid` (by default the shared uid): no
   * variable of the sandbox's environment is on it (see `envArgs`).
   */
  buildArgs(spec: SandboxSpec, hostUid = this.options.hostUid, hostGid = this.options.hostGid): string[] {
    const { etcDir, kitDir } = this.options
    // `egress`: the launcher (root) makes the sandbox's network namespace and its redirect rules,
    // then bwrap shares it instead of making an empty one. The sandbox's processes are not root in
    // the namespace's owner (the host's user namespace), so they cannot change the rules.
    const egress = spec.network === 'egress'
    const args = [
      ...(egress ? ['unshare', '--net', '--', '/bin/sh', '-c', NETNS_SETUP, 'cairn-netns'] : []),
      'setpriv',
      `--reuid=${hostUid}`,
      `--regid=${hostGid}`,
      '--clear-groups',
      '--no-new-privs',
      this.options.bwrapPath ?? 'bwrap',
      '--unshare-all',
      ...(egress ? ['--share-net'] : []),
      '--unshare-user',
      '--disable-userns',
      ...(this.seccomp ? ['--seccomp', '3'] : []),
      '--die-with-parent',
      '--new-session',
      '--hostname',
      'cairn',
      // An image: its overlay (the image below, the sandbox's tmpfs above) is the root, writable.
      ...(spec.rootfs ? ['--bind', spec.rootfs, '/'] : readOnlyRootArgs(etcDir)),
      '--proc',
      '/proc',
      '--dev',
      '/dev',
      '--tmpfs',
      '/tmp',
      '--dir',
      '/run',
      '--ro-bind',
      spec.runDir,
      '/run/cairn',
      '--ro-bind',
      kitDir,
      '/opt/cairn',
      '--bind',
      spec.workspaceDir,
      '/workspace',
      // Before the binds, which keep persisted directories inside it.
      ...(spec.home ? ['--perms', '0700', '--tmpfs', spec.home] : []),
      ...(spec.binds ?? []).flatMap((bind) => [
        bind.readOnly ? '--ro-bind' : '--bind',
        bind.source,
        bind.dest,
      ]),
      // Last of the mounts (bwrap creates mount points in the root): the root tmpfs bwrap builds
      // on is writable, and only /workspace, /tmp and /dev/shm are meant to be. An image's root
      // is the sandbox's own overlay, meant to be written (and gone with the sandbox).
      ...(spec.rootfs ? [] : ['--remount-ro', '/']),
      '--chdir',
      '/workspace',
      '--uid',
      String(SANDBOX_USER.uid),
      '--gid',
      String(SANDBOX_USER.gid),
      '--clearenv',
      '--args',
      String(ENV_FD),
      '--',
      ...spec.command,
    ]
    return args
  }

  async start(spec: SandboxSpec): Promise<Sandbox> {
    if (spec.command.length === 0) throw new CairnProblem('bad_request', 'empty sandbox command')
    refuseNul(spec, this.buildArgs(spec))
    const limits = {
      memoryBytes: spec.limits.memoryMiB * 1024 * 1024,
      pids: spec.limits.pids,
      cpus: spec.limits.cpus,
    }
    // The launcher first: the sandbox's mounts are made in its mount namespace.
    const launcher = await this.launcher(spec.id, limits)
    const pid = launcher.child.pid ?? -1
    let identity: SandboxIdentity
    try {
      identity = await this.writableRoot(await this.identity(spec, pid), pid)
    } catch (error) {
      await discardLauncher(this.options.cgroups, launcher, this.logger)
      throw error
    }
    return this.handOver(launcher, identity)
  }

  /** A spare launcher with these limits, or a new one. */
  private async launcher(id: string, limits: CgroupLimits): Promise<SpareLauncher> {
    const spare = this.launchers?.take(limits)
    if (spare) {
      try {
        // Limits first: the command (and so the agent) starts only once it reads them on fd 4.
        this.options.cgroups.setLimits(spare.cgroupName, limits)
        return spare
      } catch {
        // A cgroup that refuses these limits (or is gone): drop the spare, start from scratch.
        await this.launchers?.discard(spare)
      }
    }
    // The launcher (launcher.ts) closes what it inherited above fd 5, joins the cgroups as root,
    // unshares its mount namespace, then waits to become bwrap (dropping to the sandbox uid): the
    // whole sandbox, including processes bwrap forks, is inside the cgroup from its first
    // instruction. fd 3: the seccomp program.
    const seccompFd = this.seccomp ? await this.seccompFd() : undefined
    const launcher = await startLauncher(this.options.cgroups, id, limits, seccompFd)
    if (!launcher) throw new CairnProblem('sandbox_failed', 'could not start the sandbox launcher')
    return launcher
  }

  /**
   * Gives a waiting launcher its sandbox: the environment on fd 5, then the command on fd 4, which
   * stays open as the sandbox's stdin and stdout.
   */
  private handOver(launcher: SpareLauncher, identity: SandboxIdentity): Sandbox {
    const { spec, uid, gid, release } = identity
    launcher.envPipe.end(this.envStream(spec))
    launcher.commandPipe.write(bwrapCommandStream(this.buildArgs(spec, uid, gid), spec.stderrFile))
    const { cgroups } = this.options
    const child = launcher.child
    // A command joins the sandbox's cgroups and gets its seccomp program (none only where it has none).
    const exec = async (execSpec: SandboxExecSpec) =>
      execInSandbox(
        {
          outerPid: child.pid ?? -1,
          procsFiles: cgroups.procsFiles(launcher.cgroupName),
          seccompFile: this.seccomp ? await this.seccompPath() : undefined,
        },
        execSpec,
      )
    const stdio = { io: launcher.commandPipe, stderr: child.stderr as Readable, stderrFile: spec.stderrFile }
    return new BwrapSandbox(spec.id, child, stdio, cgroups, launcher.cgroupName, release, this.logger, exec)
  }

  async reapOrphans(): Promise<number> {
    const names = await this.options.cgroups.list()
    for (const name of names) {
      // A frozen orphan (crash during a snapshot) must thaw to die on a v1 freezer; on v2 (or with no
      // freezer) the kill below works frozen or not, so a failed thaw is only reported.
      await this.options.cgroups
        .freeze(name, false)
        .catch(
          logAndGoOn(this.logger, 'debug', { cgroup: name }, 'could not thaw an orphan before killing it'),
        )
      await this.options.cgroups.kill(name)
      await this.options.cgroups.remove(name)
    }
    await this.removeAllLeftMounts()
    return names.length
  }

  /**
   * Idmapped mounts and writable roots a run of an earlier version left in the host's namespace
   * under `dir` (they are made in each launcher's own namespace now), then `dir` itself.
   */
  private async removeLeftMounts(dir: string | undefined, what: string): Promise<void> {
    if (!dir) return
    const points = readMounts()
      .map((m) => m.mountPoint)
      .filter((p) => p.startsWith(`${dir}/`))
      .sort((a, b) => b.length - a.length)
    // A mount that stays is checked just below: the directory is then kept, never removed through it.
    for (const point of points) {
      await execTool('umount', ['-l', point]).catch(
        logAndGoOn(this.logger, 'warn', { point }, `left ${what}`),
      )
    }
    if (!readMounts().some((m) => m.mountPoint.startsWith(`${dir}/`))) {
      // Nothing is mounted under it any more: what cannot be removed now only takes space.
      await rm(dir, { recursive: true, force: true }).catch(
        logAndGoOn(this.logger, 'warn', { dir }, `could not remove the directory of ${what}`),
      )
    }
  }

  private async removeAllLeftMounts(): Promise<void> {
    await this.removeLeftMounts(this.options.sandboxUids?.idmapDir, 'an idmapped mount')
    await this.removeLeftMounts(this.options.overlayDir, "a sandbox's writable root")
  }

  async close(): Promise<void> {
    await this.launchers?.close()
    this.mounter.close()
    this.overlays.close()
    await this.removeAllLeftMounts()
    await this.options.cgroups.removeScope()
  }
}

interface SandboxIdentity {
  uid: number
  gid: number
  spec: SandboxSpec
  /** Frees the uid (once the sandbox is gone; its mounts went with its launcher's namespace). */
  release: () => Promise<void>
}

/** A bwrap sandbox's streams: one socket for its stdin and stdout, its stderr (a pipe, or a file). */
interface BwrapStdio {
  io: Duplex
  stderr: Readable
  stderrFile: string | undefined
}

class BwrapSandbox implements Sandbox {
  readonly driver = 'bwrap'
  readonly pid: number
  readonly exited: Promise<SandboxExit>
  private destroyed = false

  constructor(
    readonly id: string,
    private readonly child: ChildProcess,
    private readonly stdio: BwrapStdio,
    private readonly cgroups: CgroupManager,
    private readonly cgroupName: string,
    private readonly release: () => Promise<void>,
    private readonly logger: Logger,
    private readonly execIn: (spec: SandboxExecSpec) => Promise<SandboxExecProcess>,
  ) {
    this.pid = child.pid ?? -1
    // A write to a dead agent's stdin must surface as the turn's failure, not as a crash (the
    // launcher pool listens for the socket's errors from its start). The pool paused the socket
    // after the launcher's ready byte: it flows again once the agent's output has a reader.
    const flowOnRead = (event: string | symbol) => {
      if (event !== 'data') return
      stdio.io.off('newListener', flowOnRead)
      process.nextTick(() => stdio.io.resume())
    }
    stdio.io.on('newListener', flowOnRead)
    this.exited = new Promise((resolve) => {
      const settle = (code: number | null, signal: NodeJS.Signals | null) =>
        resolve({ code, signal, limit: this.limitHit() })
      // 'close' comes once stdout and stderr are drained, so the reply and the stderr tail are
      // complete; every process holding the pipes dies with the sandbox's pid namespace, but a
      // bounded wait keeps a stuck pipe from hiding the exit.
      child.once('close', settle)
      child.once('exit', (code, signal) => {
        setTimeout(() => settle(code, signal), EXIT_DRAIN_MS).unref()
      })
    })
    // Every process of the sandbox dies with bwrap (the init of its pid namespace).
    void this.exited.then(() => this.release())
  }

  get stdin() {
    return this.stdio.io
  }
  get stdout() {
    return this.stdio.io
  }
  get stderr() {
    return this.stdio.stderr
  }
  get stderrFile() {
    return this.stdio.stderrFile
  }

  limitHit(): 'memory' | 'pids' | undefined {
    const counters = this.cgroups.counters(this.cgroupName)
    if (counters.oomKills > 0) return 'memory'
    if (counters.pidsMaxHits > 0) return 'pids'
    return undefined
  }

  exec(spec: SandboxExecSpec): Promise<SandboxExecProcess> {
    if (this.destroyed) throw new CairnProblem('sandbox_not_running', 'the sandbox was stopped')
    return this.execIn(spec)
  }

  async networkNamespace(): Promise<string | undefined> {
    const pid = await sandboxNetworkPid(this.pid)
    return pid === undefined ? undefined : `/proc/${pid}/ns/net`
  }

  freeze(): Promise<void> {
    return this.cgroups.freeze(this.cgroupName, true)
  }

  thaw(): Promise<void> {
    return this.cgroups.freeze(this.cgroupName, false)
  }

  writtenBytes(): number | undefined {
    if (this.destroyed) return undefined
    const { pids, tids } = this.cgroups.tasksSync(this.cgroupName)
    return dirtiedBytes(pids, tids)
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return
    this.destroyed = true
    // Thawing only matters on a v1 freezer (v2's cgroup.kill kills frozen tasks); the SIGKILL and the
    // bounded wait below end the sandbox either way.
    await this.cgroups
      .freeze(this.cgroupName, false)
      .catch(
        logAndGoOn(
          this.logger,
          'debug',
          { sandboxId: this.id },
          'could not thaw the sandbox before killing it',
        ),
      )
    await this.cgroups.kill(this.cgroupName)
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL')
    await Promise.race([this.exited, new Promise((r) => setTimeout(r, 2000))])
    await this.cgroups.remove(this.cgroupName)
    await this.release()
  }
}

/**
 * bwrap reads its options and the environment NUL-separated (fd 4 and `--args`): a NUL inside a
 * value would end it there and make the rest options of bwrap's own (a secret's value gave the
 * agent every capability with `--cap-add ALL`). Refused before anything starts; a variable is
 * named, never its value (it may be a secret).
 */
function refuseNul(spec: Pick<SandboxSpec, 'env'>, args: readonly string[]): void {
  for (const [name, value] of Object.entries(sandboxEnv(spec)))
    if (`${name}${value}`.includes('\0'))
      throw new CairnProblem(
        'sandbox_failed',
        `the sandbox's environment variable ${name.replaceAll('\0', '\\0')} holds a NUL character`,
      )
  if (args.some((arg) => arg.includes('\0')))
    throw new CairnProblem('sandbox_failed', "an option of the sandbox's command line holds a NUL character")
}
