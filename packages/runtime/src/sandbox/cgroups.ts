import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { mkdir, readdir, rmdir, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { type Logger, logAndGoOn, noopLogger } from '../util/logger.js'
import { readMounts } from '../util/mounts.js'
import { readKernelFile } from '../util/proc-io.js'

export interface CgroupLimits {
  memoryBytes: number
  pids: number
  /** CPU share as a number of cores (0.5 = half a core). */
  cpus: number
}

export interface LimitCounters {
  oomKills: number
  pidsMaxHits: number
}

export interface CgroupLayout {
  /** cgroup2 mount (pure v2, or the `unified` hierarchy of a hybrid host). */
  v2: string | undefined
  /** Whether the v2 hierarchy carries the memory/pids/cpu controllers. */
  v2Controllers: boolean
  v1: { memory?: string; pids?: string; cpu?: string; freezer?: string }
}

/** How many 10 ms polls `kill` waits for killed namespace inits to be reaped. */
const INIT_EXIT_POLLS = 50

function signal(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL')
  } catch {
    // already gone
  }
}

/** Whether the process is PID 1 of a pid namespace nested in ours (a sandbox's init). */
function isNamespaceInit(pid: number): boolean {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8')
    const nspid = /^NSpid:\s+(.*)$/m.exec(status)?.[1]?.trim().split(/\s+/) ?? []
    return nspid.length > 1 && nspid.at(-1) === '1'
  } catch {
    return false
  }
}

export function detectCgroupLayout(): CgroupLayout {
  const layout: CgroupLayout = { v2: undefined, v2Controllers: false, v1: {} }
  for (const m of readMounts()) {
    if (m.fsType === 'cgroup2' && !layout.v2) layout.v2 = m.mountPoint
    if (m.fsType === 'cgroup') {
      const opts = m.options.split(',')
      const superOpts = m.mountPoint.split('/').pop() ?? ''
      for (const ctl of ['memory', 'pids', 'cpu', 'freezer'] as const) {
        if ((superOpts.split(',').includes(ctl) || opts.includes(ctl)) && !layout.v1[ctl])
          layout.v1[ctl] = m.mountPoint
      }
    }
  }
  if (layout.v2) {
    const controllers = readFileSync(path.join(layout.v2, 'cgroup.controllers'), 'utf8').split(/\s+/)
    layout.v2Controllers = ['memory', 'pids', 'cpu'].every((c) => controllers.includes(c))
  }
  return layout
}

/**
 * One cgroup per sandbox, on cgroup v2 when it carries the controllers, otherwise on the v1
 * controllers for limits plus the v2 hierarchy (when mounted) for `cgroup.kill` and freezing.
 */
export class CgroupManager {
  private readonly layout = detectCgroupLayout()

  /**
   * @param scope path segment under which this instance's cgroups live, e.g. `cairn/3f2a…`.
   * @param logger where the steps it goes on without are reported.
   */
  constructor(
    private readonly scope: string,
    private readonly logger: Logger = noopLogger,
  ) {}

  describe(): string {
    const v1 = Object.keys(this.layout.v1).join(',')
    return this.layout.v2Controllers
      ? 'cgroup v2'
      : `cgroup v1 (${v1})${this.layout.v2 ? ' + v2 for kill/freeze' : ''}`
  }

  private dirs(name: string): {
    v2?: string
    memory?: string
    pids?: string
    cpu?: string
    freezer?: string
  } {
    const rel = path.join(this.scope, name)
    const out: { v2?: string; memory?: string; pids?: string; cpu?: string; freezer?: string } = {}
    if (this.layout.v2) out.v2 = path.join(this.layout.v2, rel)
    if (!this.layout.v2Controllers) {
      for (const ctl of ['memory', 'pids', 'cpu', 'freezer'] as const) {
        const mount = this.layout.v1[ctl]
        if (mount) out[ctl] = path.join(mount, rel)
      }
    }
    return out
  }

  /** Creates the cgroup with its limits and returns the `cgroup.procs` files to join. */
  async create(name: string, limits: CgroupLimits): Promise<string[]> {
    const dirs = this.dirs(name)
    if (this.layout.v2Controllers && this.layout.v2) await this.enableV2Controllers()
    for (const dir of Object.values(dirs)) await mkdir(dir, { recursive: true })
    this.setLimits(name, limits)
    return Object.values(dirs).map((dir) => path.join(dir, 'cgroup.procs'))
  }

  /** The `cgroup.procs` files of an existing cgroup (a process joins it by writing its pid there). */
  procsFiles(name: string): string[] {
    return Object.values(this.dirs(name)).map((dir) => path.join(dir, 'cgroup.procs'))
  }

  /** Writes the cgroup's limits; also rewrites those of a cgroup made ahead with other limits. */
  setLimits(name: string, limits: CgroupLimits): void {
    const dirs = this.dirs(name)
    const quotaUs = Math.max(1000, Math.round(limits.cpus * 100_000))
    if (this.layout.v2Controllers && dirs.v2) {
      writeFileSync(path.join(dirs.v2, 'memory.max'), String(limits.memoryBytes))
      trySync(() => writeFileSync(path.join(dirs.v2 as string, 'memory.swap.max'), '0'))
      writeFileSync(path.join(dirs.v2, 'pids.max'), String(limits.pids))
      writeFileSync(path.join(dirs.v2, 'cpu.max'), `${quotaUs} 100000`)
    } else {
      if (dirs.memory) {
        // v1 keeps memsw >= memory: raising goes memsw first, lowering memory first; trying memsw
        // on both sides of the memory write covers both (and a fresh cgroup's unlimited values).
        const memsw = path.join(dirs.memory, 'memory.memsw.limit_in_bytes')
        trySync(() => writeFileSync(memsw, String(limits.memoryBytes)))
        writeFileSync(path.join(dirs.memory, 'memory.limit_in_bytes'), String(limits.memoryBytes))
        trySync(() => writeFileSync(memsw, String(limits.memoryBytes)))
      }
      if (dirs.pids) writeFileSync(path.join(dirs.pids, 'pids.max'), String(limits.pids))
      if (dirs.cpu) {
        writeFileSync(path.join(dirs.cpu, 'cpu.cfs_period_us'), '100000')
        writeFileSync(path.join(dirs.cpu, 'cpu.cfs_quota_us'), String(quotaUs))
      }
    }
  }

  private async enableV2Controllers(): Promise<void> {
    const v2 = this.layout.v2
    if (!v2) return
    let dir = v2
    // A controller not enabled (delegated elsewhere, or a v1 one) only loses that limit on v2: the
    // v1 hierarchy or `describe()` says what holds, so creating the cgroups goes on.
    const notEnabled = logAndGoOn(
      this.logger,
      'warn',
      { scope: this.scope },
      'could not enable cgroup v2 controllers',
    )
    for (const segment of this.scope.split('/')) {
      await writeFile(path.join(dir, 'cgroup.subtree_control'), '+memory +pids +cpu').catch(notEnabled)
      dir = path.join(dir, segment)
      await mkdir(dir, { recursive: true })
    }
    await writeFile(path.join(dir, 'cgroup.subtree_control'), '+memory +pids +cpu').catch(notEnabled)
  }

  counters(name: string): LimitCounters {
    const dirs = this.dirs(name)
    const read = (file: string | undefined, key: string): number => {
      if (!file || !existsSync(file)) return 0
      const match = new RegExp(`^${key} (\\d+)$`, 'm').exec(readFileSync(file, 'utf8'))
      return match ? Number(match[1]) : 0
    }
    if (this.layout.v2Controllers && dirs.v2) {
      return {
        oomKills: read(path.join(dirs.v2, 'memory.events'), 'oom_kill'),
        pidsMaxHits: read(path.join(dirs.v2, 'pids.events'), 'max'),
      }
    }
    return {
      oomKills: read(dirs.memory && path.join(dirs.memory, 'memory.oom_control'), 'oom_kill'),
      pidsMaxHits: read(dirs.pids && path.join(dirs.pids, 'pids.events'), 'max'),
    }
  }

  /** The cgroup's live processes, read synchronously (a tiny kernel file). */
  pidsSync(name: string): number[] {
    const dirs = this.dirs(name)
    const dir = dirs.v2 ?? dirs.pids ?? dirs.memory
    return dir ? numbersIn(path.join(dir, 'cgroup.procs')) : []
  }

  /**
   * The cgroup's live processes, then its live threads (`cgroup.threads` on v2, `tasks` on v1),
   * read synchronously one after the other.
   */
  tasksSync(name: string): { pids: number[]; tids: number[] } {
    const dirs = this.dirs(name)
    const dir = dirs.v2 ?? dirs.pids ?? dirs.memory
    if (!dir) return { pids: [], tids: [] }
    const pids = numbersIn(path.join(dir, 'cgroup.procs'))
    return { pids, tids: numbersIn(path.join(dir, dir === dirs.v2 ? 'cgroup.threads' : 'tasks')) }
  }

  async pids(name: string): Promise<number[]> {
    return this.pidsSync(name)
  }

  /**
   * Kills every process of the cgroup. Namespace inits go first: the kernel then kills and reaps
   * everything in their pid namespace, and each init is reaped by its parent (bwrap's outer process)
   * instead of becoming a zombie that only the host's PID 1 would reap, seconds later. Then
   * `cgroup.kill` where it exists, SIGKILL to each pid otherwise, for whatever is left.
   */
  async kill(name: string): Promise<void> {
    const dirs = this.dirs(name)
    const inits = (await this.pids(name)).filter(isNamespaceInit)
    for (const pid of inits) signal(pid)
    if (inits.length > 0) {
      for (let i = 0; i < INIT_EXIT_POLLS && (await this.pids(name)).length > 0; i++) {
        await new Promise((r) => setTimeout(r, 10))
      }
    }
    if (dirs.v2 && existsSync(path.join(dirs.v2, 'cgroup.kill'))) {
      // The cgroup emptied itself between the check and the write (ENOENT/ENODEV): nothing left to kill.
      await writeFile(path.join(dirs.v2, 'cgroup.kill'), '1').catch(
        logAndGoOn(this.logger, 'debug', { cgroup: name }, 'cgroup.kill failed; the cgroup is gone'),
      )
      return
    }
    for (const pid of await this.pids(name)) signal(pid)
  }

  async freeze(name: string, frozen: boolean): Promise<void> {
    const dirs = this.dirs(name)
    if (dirs.v2 && existsSync(path.join(dirs.v2, 'cgroup.freeze'))) {
      writeFileSync(path.join(dirs.v2, 'cgroup.freeze'), frozen ? '1' : '0')
      if (frozen) {
        // Freezing completes asynchronously; wait until every task is stopped (bounded).
        // Tasks blocked in a read freeze within microseconds: poll on the next turns of the event
        // loop first, then back off to 1 ms sleeps (bounded at about 200 ms).
        const events = path.join(dirs.v2, 'cgroup.events')
        for (let attempt = 0; attempt < 250; attempt++) {
          let state: string
          try {
            state = readFileSync(events, 'utf8')
          } catch {
            return // the sandbox is gone: nothing left to freeze
          }
          if (/^frozen 1$/m.test(state)) return
          await new Promise((r) => (attempt < 50 ? setImmediate(r) : setTimeout(r, 1)))
        }
      }
    } else if (dirs.freezer) {
      writeFileSync(path.join(dirs.freezer, 'freezer.state'), frozen ? 'FROZEN' : 'THAWED')
    }
  }

  /** Removes the cgroup once its processes are gone (retrying while the kernel finishes reaping). */
  async remove(name: string): Promise<void> {
    const dirs = Object.values(this.dirs(name))
    for (let attempt = 0; attempt < 50; attempt++) {
      let pending = 0
      for (const dir of dirs) {
        if (!existsSync(dir)) continue
        try {
          await rmdir(dir)
        } catch {
          pending++
        }
      }
      if (pending === 0) return
      await this.kill(name)
      await new Promise((r) => setTimeout(r, 20))
    }
  }

  /**
   * Removes this instance's scope cgroups once its sandboxes are gone. The shared parent stays:
   * removing it could race with another instance creating its scope there.
   */
  async removeScope(): Promise<void> {
    for (const dir of Object.values(this.dirs(''))) {
      // A scope still busy (EBUSY: a sandbox not yet reaped) is removed by the next start's reaping.
      if (existsSync(dir)) {
        await rmdir(dir).catch(logAndGoOn(this.logger, 'warn', { dir }, 'left a cgroup scope in place'))
      }
    }
  }

  /** Names of the sandbox cgroups that exist for this instance (orphans after a crash). */
  async list(): Promise<string[]> {
    const dirs = this.dirs('')
    const base = dirs.v2 ?? dirs.memory ?? dirs.pids
    if (!base || !existsSync(base)) return []
    const entries = await readdir(base, { withFileTypes: true })
    return entries.filter((e) => e.isDirectory()).map((e) => e.name)
  }
}

/** Cgroup files are tiny kernel interfaces: written synchronously (a thread-pool trip costs more). */
function trySync(fn: () => void): void {
  try {
    fn()
  } catch {
    // optional knob (swap, memsw) not present on this host
  }
}

/** The numbers of a cgroup's list file (one a line); none when it cannot be read. */
function numbersIn(file: string): number[] {
  try {
    return readKernelFile(file)
      .split('\n')
      .filter(Boolean)
      .map((line) => Number(line))
  } catch {
    return []
  }
}
