import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { EventEmitter } from 'node:events'
import { existsSync, readFileSync } from 'node:fs'
import { mkdir, rm, writeFile } from 'node:fs/promises'
import { constants } from 'node:os'
import path from 'node:path'
import type { Readable } from 'node:stream'
import { execTool } from '../util/exec.js'
import { type Logger, logAndGoOn, noopLogger } from '../util/logger.js'
import { readMounts } from '../util/mounts.js'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'
import type { CgroupLimits, CgroupManager } from './cgroups.js'
import type { Sandbox, SandboxSpec } from './driver.js'
import { Mounter } from './gvisor-mounter.js'
import { childIo, GvisorSandbox } from './gvisor-sandbox.js'
import { buildSlotOciSpec, type GvisorSpecOptions, lateMountDests, prepareSlotRoot } from './gvisor-spec.js'
import { LAUNCHER_SHELL, launcherArgs } from './launcher.js'
import { type RunscConfig, runsc, runscFlags } from './runsc.js'
import { sandboxEnvInWorkspace } from './sandbox-env.js'

/**
 * The first process of a pool slot: it waits for one line on stdin, the real command (a
 * `cd /workspace && exec env -i …` line the driver writes on claim), and becomes it. `nl` lets that line carry
 * newlines inside values. dash reads stdin one byte at a time, so nothing meant for the agent is lost.
 */
export const SLOT_INIT = 'nl=\'\n\'; IFS= read -r line || exit 111; eval "$line"'

/** Container ids of pool slots (sandbox ids are `sbx_…`). */
export const POOL_SLOT_PREFIX = 'gvpool_'

/**
 * The slot's holder (python3, which every sandbox host has): it becomes a child subreaper, runs
 * `runsc create` (which leaves the sandbox process to it), reports `created` on fd 3, then reaps the
 * sandbox and reports `exit <status>`: the container's status, which `runsc wait` cannot always
 * give for a root container that ends fast. It also keeps the agent's stdio pipes open until then:
 * Node closes a child's stdin once the child exits, and the slot's stdin must outlive `runsc create`.
 */
const SLOT_HOLDER = `import ctypes, os, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
report = os.fdopen(3, "w", buffering=1)
code = subprocess.call(sys.argv[2:])
if code != 0:
    sys.exit(code)
sandbox = int(open(sys.argv[1]).read().strip())
report.write("created\\n")
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    if pid == sandbox:
        report.write("exit %d\\n" % os.waitstatus_to_exitcode(status))
`

/** Limits a slot waits with; the claim writes the session's own before the agent starts. */
const SLOT_LIMITS: CgroupLimits = { memoryBytes: 512 * 1024 * 1024, pids: 4096, cpus: 1 }

/** How long after a claim the pool starts booting its replacement. */
const REFILL_DELAY_MS = 300

/** At most this many layouts (sets of mount points) keep warm slots; the least recent goes first. */
const MAX_LAYOUTS = 4

/** Where a claim's time went (`performance.now()` instants), for the gVisor bench. */
export interface ClaimTiming {
  /** The claim began: a ready slot was taken. */
  claimedAt: number
  /** The slot's cgroup has the session's limits. */
  limitedAt: number
  /** The session's directories are bound into the slot. */
  boundAt: number
  /** The agent's command is written to the waiting init. */
  handedAt: number
}

export interface GvisorPoolOptions {
  cgroups: CgroupManager
  /** Where it reports the steps it goes on without (failed cleanups); default none. */
  logger?: Logger | undefined
  runsc: RunscConfig
  spec: GvisorSpecOptions
  /** Slots kept ready per layout. */
  size: number
  /** Directory of the slots' mount points (made a shared mount, so binds reach the gofers). */
  slotsDir: string
  bundlesDir: string
  /** The host limits of a claimed sandbox (the driver adds its machinery's share). */
  hostLimits: (spec: SandboxSpec) => CgroupLimits
}

interface Slot {
  id: string
  layout: string
  dir: string
  bundle: string
  child: ChildProcessWithoutNullStreams
  pid: number
  /** Mount point (under the slot's root) per sandbox path: /workspace, /run/cairn, then the binds in order. */
  mountPoints: { dest: string; point: string }[]
  /** The sandbox's end as its holder reports it. */
  end?: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
}

/** Emits 'line' for each line of a stream. */
function lines(stream: Readable): EventEmitter {
  const emitter = new EventEmitter()
  let pending = ''
  stream.setEncoding('utf8')
  stream.on('data', (chunk: string) => {
    pending += chunk
    for (let nl = pending.indexOf('\n'); nl >= 0; nl = pending.indexOf('\n')) {
      emitter.emit('line', pending.slice(0, nl))
      pending = pending.slice(nl + 1)
    }
  })
  return emitter
}

function signalName(n: number): NodeJS.Signals {
  const found = Object.entries(constants.signals).find(([, value]) => value === n)?.[0]
  return (found ?? 'SIGKILL') as NodeJS.Signals
}

/** Which slots can serve a spec: the same mount points (sources are bound on claim) and network. */
export function layoutKey(spec: Pick<SandboxSpec, 'network' | 'binds'>): string {
  const binds = (spec.binds ?? []).map((b) => `${b.dest}:${b.readOnly ? 'ro' : 'rw'}`)
  return JSON.stringify([spec.network ?? 'none', ...binds])
}

/** Quotes one word for the slot's init line (sh, single quotes; newlines through `$nl`). */
export function shellWord(word: string): string {
  return `'${word.replace(/'/g, `'\\''`).replace(/\n/g, `'"$nl"'`)}'`
}

/**
 * Pre-started gVisor sandboxes: each slot is a booted sandbox (`runsc create` and `start`) whose
 * init waits for one line on stdin. Its root is a per-slot directory holding empty mount points
 * for the session's directories (see `prepareSlotRoot`). A claim binds the session's directories
 * there on the host (they reach the gofer's mount namespace through mount propagation, and gVisor
 * walks into them like into any directory of its root) and writes the agent's command to the init:
 * no runsc command runs on the claim path. The sandbox is the same as a cold one: same paths,
 * environment, uid and limits; read-only binds are read-only mounts on the host.
 */
export class GvisorPool {
  private readonly ready = new Map<string, Slot[]>()
  private readonly filling = new Map<string, Promise<void>>()
  private readonly layouts: { key: string; spec: Pick<SandboxSpec, 'network' | 'binds'> }[] = []
  private closed = false
  private sharedMount = false
  /** Starts served from a slot, and starts that found none ready (and booted cold). */
  readonly counts = { claimed: 0, missed: 0, failed: 0 }
  /** Why the last claim that failed (and fell back to a cold start) failed. */
  lastFailure: string | undefined
  lastClaim: ClaimTiming | undefined
  private readonly mounter = new Mounter()

  private readonly logger: Logger

  constructor(private readonly options: GvisorPoolOptions) {
    this.logger = options.logger ?? noopLogger
  }

  /** Whether a spec can be served from slots at all (env and command go through the init line). */
  static fits(spec: SandboxSpec): boolean {
    return !(spec.command[0] ?? '').includes('=')
  }

  size(): number {
    let n = 0
    for (const slots of this.ready.values()) n += slots.length
    return n
  }

  /** Keeps `size` slots ready for this layout (in the background). */
  warm(spec: Pick<SandboxSpec, 'network' | 'binds'>): void {
    if (this.closed || this.options.size <= 0) return
    const key = layoutKey(spec)
    const known = this.layouts.findIndex((l) => l.key === key)
    if (known >= 0) this.layouts.splice(known, 1)
    this.layouts.unshift({ key, spec: { network: spec.network, binds: spec.binds } })
    for (const stale of this.layouts.splice(MAX_LAYOUTS)) void this.drop(stale.key)
    if (this.filling.has(key)) return
    const fill = (async () => {
      while (!this.closed && (this.ready.get(key)?.length ?? 0) < this.options.size) {
        // gVisor cannot start here now: the layout stays unpooled and cold starts say why.
        const slot = await this.createSlot(key, spec).catch(
          logAndGoOn(
            this.logger,
            'warn',
            { layout: key },
            'could not pre-start a gVisor sandbox; booting on demand',
          ),
        )
        if (!slot) return
        if (this.closed) return void (await this.discard(slot))
        this.ready.set(key, [...(this.ready.get(key) ?? []), slot])
      }
    })().finally(() => this.filling.delete(key))
    this.filling.set(key, fill)
  }

  /** A started sandbox from a ready slot, or undefined when none fits (the driver starts one cold). */
  async claim(spec: SandboxSpec): Promise<Sandbox | undefined> {
    if (this.closed || !GvisorPool.fits(spec)) return undefined
    const key = layoutKey(spec)
    const slot = this.ready.get(key)?.shift()
    // Refill once this claim has started: booting a slot beside it would slow the start down.
    setTimeout(() => this.warm(spec), slot ? REFILL_DELAY_MS : 0).unref()
    if (!slot) {
      this.counts.missed++
      return undefined
    }
    try {
      const sandbox = await this.start(slot, spec)
      this.counts.claimed++
      return sandbox
    } catch (error) {
      this.counts.failed++
      this.lastFailure = error instanceof Error ? error.message : String(error)
      await this.discard(slot)
      return undefined
    }
  }

  private async start(slot: Slot, spec: SandboxSpec): Promise<Sandbox> {
    const { cgroups, runsc: config } = this.options
    const claimedAt = performance.now()
    // The slot's cgroup exists since its boot (holding its processes): only its limits change.
    cgroups.setLimits(slot.id, this.options.hostLimits(spec))
    const limitedAt = performance.now()
    const sources = [
      { source: spec.workspaceDir, readOnly: false },
      { source: spec.runDir, readOnly: true },
      ...(spec.binds ?? []),
    ]
    await Promise.all(
      slot.mountPoints.map((m, i) => {
        const { source, readOnly } = sources[i] ?? { source: '', readOnly: true }
        return this.mounter.bind(source, m.point, readOnly, path.join(this.stagingDir, `${slot.id}-${i}`))
      }),
    )
    const boundAt = performance.now()
    // Whatever runsc create and start wrote to the pipes is not the agent's.
    for (const stream of [slot.child.stdout, slot.child.stderr]) while (stream.read() !== null);
    const env = Object.entries(sandboxEnvInWorkspace(spec)).map(([k, v]) => shellWord(`${k}=${v}`))
    slot.child.stdin.write(
      `cd /workspace || exit 111; exec env -i ${env.join(' ')} ${spec.command.map(shellWord).join(' ')}\n`,
    )
    this.lastClaim = { claimedAt, limitedAt, boundAt, handedAt: performance.now() }
    const ended = slot.end ?? Promise.resolve({ code: null, signal: 'SIGKILL' as const })
    return new GvisorSandbox(spec.id, slot.pid, childIo(slot.child), ended, {
      cgroups,
      name: slot.id,
      runsc: config,
      bundle: slot.bundle,
      release: () => this.release(slot),
      logger: this.logger,
    })
  }

  private get stagingDir(): string {
    return path.join(this.options.slotsDir, '.staging')
  }

  /**
   * The slots directory is a shared mount (binds under it reach the gofers); its staging directory
   * is a private mount inside it, where read-only binds are prepared out of the gofers' sight.
   */
  private async ensureSharedMount(): Promise<void> {
    if (this.sharedMount) return
    const dir = this.options.slotsDir
    await mkdir(dir, { recursive: true, mode: 0o711 })
    if (!readMounts().some((m) => m.mountPoint === dir)) {
      await execTool('mount', ['--bind', dir, dir], { code: 'sandbox_failed' })
    }
    await execTool('mount', ['--make-rshared', dir], { code: 'sandbox_failed' })
    const staging = this.stagingDir
    await mkdir(staging, { recursive: true, mode: 0o700 })
    if (!readMounts().some((m) => m.mountPoint === staging)) {
      await execTool('mount', ['--bind', staging, staging], { code: 'sandbox_failed' })
    }
    await execTool('mount', ['--make-private', staging], { code: 'sandbox_failed' })
    this.sharedMount = true
  }

  private async createSlot(key: string, spec: Pick<SandboxSpec, 'network' | 'binds'>): Promise<Slot> {
    await this.ensureSharedMount()
    const id = `${POOL_SLOT_PREFIX}${randomBytes(8).toString('hex')}`
    const dir = path.join(this.options.slotsDir, id)
    const root = path.join(dir, 'root')
    const bundle = path.join(this.options.bundlesDir, id)
    const dests = lateMountDests(spec)
    const mountPoints = dests.map((dest) => ({ dest, point: path.join(root, dest) }))
    await prepareSlotRoot(root, dests)
    // The slot's root is read-only on the host (writes to it fail as in a cold sandbox); binds made
    // on its mount points later are their own mounts, read-write or not. Its own peer group: a bind
    // of a directory of the shared slots mount would be that mount's peer, and get every bind twice.
    await execTool(
      '/bin/sh',
      [
        '-c',
        'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && mount --make-private "$1" && mount --make-shared "$1"',
        'slot-root',
        root,
      ],
      { code: 'sandbox_failed' },
    )
    await mkdir(bundle, { recursive: true })
    const slotSpec: SandboxSpec = {
      id,
      workspaceDir: mountPoints[0]?.point ?? '',
      runDir: mountPoints[1]?.point ?? '',
      command: ['/bin/sh', '-c', SLOT_INIT],
      env: {},
      limits: { memoryMiB: 0, pids: 0, cpus: 1 },
      network: spec.network,
      binds: (spec.binds ?? []).map((b, i) => ({ ...b, source: mountPoints[i + 2]?.point ?? '' })),
    }
    const oci = buildSlotOciSpec(slotSpec, root, this.options.spec) as { process: { env: string[] } }
    oci.process.env = [] // the init line brings the environment
    await writeFile(path.join(bundle, 'config.json'), JSON.stringify(oci), { mode: 0o600 })
    const procsFiles = await this.options.cgroups.create(id, SLOT_LIMITS)
    const pidFile = path.join(bundle, 'pid')
    const config = this.options.runsc
    const flags = runscFlags(config, { sharedRoot: true })
    // The launcher keeps fd 3 (the holder's reports) and closes what was inherited above it; the
    // holder starts runsc with only stdio (subprocess's close_fds).
    const child = spawn(
      LAUNCHER_SHELL,
      launcherArgs(3, procsFiles, [
        'python3',
        '-c',
        SLOT_HOLDER,
        pidFile,
        config.path,
        '--root',
        config.root,
        ...flags,
        'create',
        '--bundle',
        bundle,
        '--pid-file',
        pidFile,
        id,
      ]),
      {
        stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
        env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
        ...OWN_PROCESS_GROUP,
      },
    ) as ChildProcessWithoutNullStreams
    child.stdin.on('error', () => undefined)
    const slot: Slot = { id, layout: key, dir, bundle, child, pid: -1, mountPoints }
    const reports = lines(child.stdio[3] as Readable)
    const created = await new Promise<boolean>((resolve) => {
      reports.once('line', (line: string) => resolve(line === 'created'))
      child.once('exit', () => resolve(false))
    })
    slot.end = new Promise((resolve) => {
      reports.on('line', (line: string) => {
        const status = /^exit (-?\d+)$/.exec(line)?.[1]
        if (status === undefined) return
        const n = Number(status)
        // A negative status is a signal that killed gVisor itself (the OOM killer, a destroy).
        resolve(n >= 0 ? { code: n, signal: null } : { code: null, signal: signalName(-n) })
      })
      child.once('exit', () => resolve({ code: null, signal: 'SIGKILL' }))
    })
    if (!created || !existsSync(pidFile)) {
      await this.discard(slot)
      throw new Error('runsc create failed')
    }
    slot.pid = Number(readFileSync(pidFile, 'utf8').trim()) || -1
    // Booted ahead: the init (sh) runs and waits for its line, so a claim runs no runsc command.
    try {
      await runsc(config, [...flags, 'start', id])
    } catch (error) {
      await this.discard(slot)
      throw error
    }
    return slot
  }

  /** Unmounts a slot's binds and removes its directory (after its sandbox is gone). */
  private async release(slot: Slot): Promise<void> {
    await unmountAll(slot.dir, this.logger)
    if (readMounts().some((m) => m.mountPoint.startsWith(`${slot.dir}/`))) return
    // Nothing is mounted under it any more: a directory left only takes space until `cleanupSlots`.
    await rm(slot.dir, { recursive: true, force: true }).catch(
      logAndGoOn(this.logger, 'warn', { dir: slot.dir }, 'could not remove a slot directory'),
    )
  }

  private async discard(slot: Slot): Promise<void> {
    const { cgroups, runsc: config } = this.options
    await cgroups.kill(slot.id)
    // Its processes died with the cgroup kill: a failed delete leaves runsc state, reaped at the next start.
    await runsc(config, ['delete', '--force', slot.id]).catch(
      logAndGoOn(this.logger, 'warn', { sandboxId: slot.id }, 'runsc delete of a pool slot failed'),
    )
    slot.child.kill('SIGKILL')
    slot.child.stdin.destroy()
    slot.child.stdout.destroy()
    slot.child.stderr.destroy()
    await this.release(slot)
    await rm(slot.bundle, { recursive: true, force: true })
    await cgroups.remove(slot.id)
  }

  private async drop(key: string): Promise<void> {
    const slots = this.ready.get(key) ?? []
    this.ready.delete(key)
    for (const slot of slots) await this.discard(slot)
  }

  /** Stops filling, destroys the ready slots and unmounts the slots directory. */
  async close(): Promise<void> {
    this.closed = true
    await Promise.all([...this.filling.values()])
    for (const key of [...this.ready.keys()]) await this.drop(key)
    this.mounter.close()
    await cleanupSlots(this.options.slotsDir, this.logger)
    this.sharedMount = false
  }

  reopen(): void {
    this.closed = false
  }
}

/** Unmounts everything at or under `dir` (deepest first), lazily when a mount is still busy. */
async function unmountAll(dir: string, logger: Logger): Promise<void> {
  const points = readMounts()
    .map((m) => m.mountPoint)
    .filter((p) => p === dir || p.startsWith(`${dir}/`))
    .sort((a, b) => b.length - a.length)
  for (const point of points) {
    // A mount that stays is checked by every caller, which then keeps the directory (never removes through it).
    await execTool('umount', [point]).catch(() =>
      execTool('umount', ['-l', point]).catch(logAndGoOn(logger, 'warn', { point }, 'left a slot mount')),
    )
  }
}

/** Removes what slots (of this or a crashed process) left: their mounts, directories and the shared mount. */
export async function cleanupSlots(slotsDir: string, logger: Logger = noopLogger): Promise<void> {
  await unmountAll(slotsDir, logger)
  // Never remove through a mount: a session workspace bound in a slot must not lose a file.
  if (readMounts().some((m) => m.mountPoint === slotsDir || m.mountPoint.startsWith(`${slotsDir}/`))) return
  // Nothing is mounted under it any more: what cannot be removed now only takes space.
  await rm(slotsDir, { recursive: true, force: true }).catch(
    logAndGoOn(logger, 'warn', { dir: slotsDir }, 'could not remove the slots directory'),
  )
}
