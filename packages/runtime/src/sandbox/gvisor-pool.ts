import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { EventEmitter } from 'node:events'
import { existsSync, readFileSync } from 'node:fs'
import { mkdir, rm, writeFile } from 'node:fs/promises'
import { constants } from 'node:os'
import path from 'node:path'
import type { Readable } from 'node:stream'
import { execTool } from '../util/exec.js'
import { readMounts } from '../util/mounts.js'
import type { CgroupLimits, CgroupManager } from './cgroups.js'
import type { Sandbox, SandboxSpec } from './driver.js'
import { childIo, GvisorSandbox } from './gvisor-sandbox.js'
import { buildOciSpec, type GvisorSpecOptions } from './gvisor-spec.js'
import { type RunscConfig, runsc, runscFlags } from './runsc.js'
import { sandboxEnvInWorkspace } from './sandbox-env.js'

/**
 * The first process of a pool slot: it waits for one line on stdin, the real command (an
 * `exec env -i …` line the driver writes on claim), and becomes it. `nl` lets that line carry
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

export interface GvisorPoolOptions {
  cgroups: CgroupManager
  runsc: RunscConfig
  spec: GvisorSpecOptions
  /** Slots kept ready per layout. */
  size: number
  /** Directory of the slots' mount points (made a shared mount, so binds reach the gofers). */
  slotsDir: string
  bundlesDir: string
  /** The host limits of a claimed sandbox (the driver adds its machinery's share). */
  hostLimits: (spec: SandboxSpec) => CgroupLimits
  launcher: string
}

interface Slot {
  id: string
  layout: string
  dir: string
  bundle: string
  child: ChildProcessWithoutNullStreams
  pid: number
  /** Mount point per sandbox path: /workspace, /run/cairn, then the binds in order. */
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
 * Pre-started gVisor sandboxes: each slot is `runsc create`d (gofer and sentry booted, waiting for
 * `start`) with its mount sources pointing at empty per-slot directories. A claim bind-mounts the
 * session's directories there (they reach the gofer's mount namespace through mount propagation,
 * before it opens them at start), starts the container and hands the agent's command to the
 * waiting init. The sandbox is the same as a cold one: same mounts, environment, uid and limits.
 */
export class GvisorPool {
  private readonly ready = new Map<string, Slot[]>()
  private readonly filling = new Map<string, Promise<void>>()
  private readonly layouts: { key: string; spec: Pick<SandboxSpec, 'network' | 'binds'> }[] = []
  private closed = false
  private sharedMount = false

  constructor(private readonly options: GvisorPoolOptions) {}

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
        const slot = await this.createSlot(key, spec).catch(() => undefined)
        if (!slot) return // gVisor cannot start here now: cold starts will say why
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
    if (!slot) return undefined
    try {
      return await this.start(slot, spec)
    } catch {
      await this.discard(slot)
      return undefined
    }
  }

  private async start(slot: Slot, spec: SandboxSpec): Promise<Sandbox> {
    const { cgroups, runsc: config } = this.options
    await cgroups.create(slot.id, this.options.hostLimits(spec))
    const sources = [spec.workspaceDir, spec.runDir, ...(spec.binds ?? []).map((b) => b.source)]
    await Promise.all(
      slot.mountPoints.map((m, i) =>
        execTool('mount', ['--bind', sources[i] ?? '', m.point], { code: 'sandbox_failed' }),
      ),
    )
    // Whatever runsc create wrote to the pipes is not the agent's.
    for (const stream of [slot.child.stdout, slot.child.stderr]) while (stream.read() !== null);
    await runsc(config, [...runscFlags(config, spec.network === 'host' ? 'host' : 'none'), 'start', slot.id])
    const env = Object.entries(sandboxEnvInWorkspace(spec)).map(([k, v]) => shellWord(`${k}=${v}`))
    slot.child.stdin.write(`exec env -i ${env.join(' ')} ${spec.command.map(shellWord).join(' ')}\n`)
    const ended = slot.end ?? Promise.resolve({ code: null, signal: 'SIGKILL' as const })
    return new GvisorSandbox(spec.id, slot.pid, childIo(slot.child), ended, {
      cgroups,
      name: slot.id,
      runsc: config,
      bundle: slot.bundle,
      release: () => this.release(slot),
    })
  }

  private async ensureSharedMount(): Promise<void> {
    if (this.sharedMount) return
    const dir = this.options.slotsDir
    await mkdir(dir, { recursive: true, mode: 0o711 })
    if (!readMounts().some((m) => m.mountPoint === dir)) {
      await execTool('mount', ['--bind', dir, dir], { code: 'sandbox_failed' })
    }
    await execTool('mount', ['--make-rshared', dir], { code: 'sandbox_failed' })
    this.sharedMount = true
  }

  private async createSlot(key: string, spec: Pick<SandboxSpec, 'network' | 'binds'>): Promise<Slot> {
    await this.ensureSharedMount()
    const id = `${POOL_SLOT_PREFIX}${randomBytes(8).toString('hex')}`
    const dir = path.join(this.options.slotsDir, id)
    const bundle = path.join(this.options.bundlesDir, id)
    const dests = ['/workspace', '/run/cairn', ...(spec.binds ?? []).map((b) => b.dest)]
    const mountPoints = dests.map((dest, i) => ({ dest, point: path.join(dir, String(i)) }))
    for (const m of mountPoints) await mkdir(m.point, { recursive: true, mode: 0o755 })
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
    const oci = buildOciSpec(slotSpec, this.options.spec) as { process: { env: string[] } }
    oci.process.env = [] // the init line brings the environment
    await writeFile(path.join(bundle, 'config.json'), JSON.stringify(oci), { mode: 0o600 })
    const procsFiles = await this.options.cgroups.create(id, SLOT_LIMITS)
    const pidFile = path.join(bundle, 'pid')
    const config = this.options.runsc
    const child = spawn(
      '/bin/sh',
      [
        '-c',
        this.options.launcher,
        'cairn-launch',
        String(procsFiles.length),
        ...procsFiles,
        'python3',
        '-c',
        SLOT_HOLDER,
        pidFile,
        config.path,
        '--root',
        config.root,
        ...runscFlags(config, spec.network === 'host' ? 'host' : 'none'),
        'create',
        '--bundle',
        bundle,
        '--pid-file',
        pidFile,
        id,
      ],
      { stdio: ['pipe', 'pipe', 'pipe', 'pipe'], env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' } },
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
    return slot
  }

  /** Unmounts a slot's binds and removes its directory (after its sandbox is gone). */
  private async release(slot: Slot): Promise<void> {
    await unmountAll(slot.dir)
    if (readMounts().some((m) => m.mountPoint.startsWith(`${slot.dir}/`))) return
    await rm(slot.dir, { recursive: true, force: true }).catch(() => undefined)
  }

  private async discard(slot: Slot): Promise<void> {
    const { cgroups, runsc: config } = this.options
    await cgroups.kill(slot.id)
    await runsc(config, ['delete', '--force', slot.id]).catch(() => undefined)
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
    await cleanupSlots(this.options.slotsDir)
    this.sharedMount = false
  }

  reopen(): void {
    this.closed = false
  }
}

/** Unmounts everything at or under `dir` (deepest first), lazily when a mount is still busy. */
async function unmountAll(dir: string): Promise<void> {
  const points = readMounts()
    .map((m) => m.mountPoint)
    .filter((p) => p === dir || p.startsWith(`${dir}/`))
    .sort((a, b) => b.length - a.length)
  for (const point of points) {
    await execTool('umount', [point]).catch(() => execTool('umount', ['-l', point]).catch(() => undefined))
  }
}

/** Removes what slots (of this or a crashed process) left: their mounts, directories and the shared mount. */
export async function cleanupSlots(slotsDir: string): Promise<void> {
  await unmountAll(slotsDir)
  // Never remove through a mount: a session workspace bound in a slot must not lose a file.
  if (readMounts().some((m) => m.mountPoint === slotsDir || m.mountPoint.startsWith(`${slotsDir}/`))) return
  await rm(slotsDir, { recursive: true, force: true }).catch(() => undefined)
}
