import { existsSync, readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import v8 from 'node:v8'
import vm from 'node:vm'
import { instanceRunDir } from '../../packages/runtime/dist/index.js'

/** Memory measurements of sandboxes and of this process (the server runs in it). */

export const MiB = 1024 * 1024

v8.setFlagsFromString('--expose-gc')
const gc = vm.runInNewContext('gc') as () => void

/** Rss and Pss of a process, in bytes (/proc/<pid>/smaps_rollup), or undefined once it is gone. */
export function smaps(pid: number | 'self'): { rss: number; pss: number } | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8')
    const kib = (field: string) =>
      Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? 0) * 1024
    return { rss: kib('Rss'), pss: kib('Pss') }
  } catch {
    return undefined
  }
}

export function memAvailable(): number {
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? 0) * 1024
}

/** This process's JS heap in use plus its external memory (buffers). */
export function serverHeap(): number {
  const m = process.memoryUsage()
  return m.heapUsed + m.external
}

/** This instance's sandbox cgroups, on the hierarchy that accounts memory (v1 `memory`, else v2). */
function sandboxCgroups(dataDir: string): { dirs: string[]; usageFile: string } {
  const scope = path.join('cairn', path.basename(instanceRunDir(dataDir)))
  const mounts = readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
  const v1 = mounts.find((m) => m[2] === 'cgroup' && (m[3] ?? '').split(',').includes('memory'))?.[1]
  const v2 = mounts.find((m) => m[2] === 'cgroup2')?.[1]
  for (const [root, usageFile] of [
    [v1, 'memory.usage_in_bytes'],
    [v2, 'memory.current'],
  ] as const) {
    const dir = root && path.join(root, scope)
    if (!dir || !existsSync(dir) || !existsSync(path.join(dir, usageFile))) continue
    const dirs = readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => path.join(dir, e.name))
    return { dirs, usageFile }
  }
  throw new Error(`no memory cgroup hierarchy holds ${scope}`)
}

export interface SandboxMemory {
  /** The cgroup's name: the sandbox id, or the gVisor pool slot's id. */
  name: string
  pss: number
  rss: number
  /** PSS of the processes that are not the sandbox's plumbing (bwrap sandboxes only). */
  agentPss: number
  cgroupUsage: number
  processes: string[]
}

function isSpareLauncher(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes('cairn-launch')
  } catch {
    return false
  }
}

/**
 * A gVisor pool slot still waiting for a claim: the slot has a directory under the driver's slots
 * directory, and a claim binds the session's directories on the mount points inside its root.
 */
function isWaitingPoolSlot(dataDir: string, name: string, mountPoints: readonly string[]): boolean {
  const root = path.join(instanceRunDir(dataDir), 'gvisor', 'slots', name, 'root')
  if (!existsSync(path.dirname(root))) return false
  return !mountPoints.some((m) => m.startsWith(`${root}/`))
}

/**
 * Sums smaps_rollup over the processes of each sandbox cgroup of a server's instance; spare
 * launchers and gVisor pool slots waiting for a claim are not sessions' sandboxes and are left out.
 * The agent (bwrap sandboxes) is what is not bwrap or the launcher's shell.
 */
export function measureSandboxes(dataDir: string): SandboxMemory[] {
  const { dirs, usageFile } = sandboxCgroups(dataDir)
  const mountPoints = readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[1] ?? '')
  const out: SandboxMemory[] = []
  for (const dir of dirs) {
    const pids = readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number)
    if (pids.length === 0) continue
    // A spare launcher waiting for its command (a fixed pool of the server's, not a session's).
    if (pids.length === 1 && isSpareLauncher(pids[0] as number)) continue
    const name = path.basename(dir)
    if (isWaitingPoolSlot(dataDir, name, mountPoints)) continue
    const m: SandboxMemory = {
      name,
      pss: 0,
      rss: 0,
      agentPss: 0,
      cgroupUsage: Number(readFileSync(path.join(dir, usageFile), 'utf8')),
      processes: [],
    }
    for (const pid of pids) {
      const mem = smaps(pid)
      if (!mem) continue
      let comm: string
      try {
        comm = readFileSync(`/proc/${pid}/comm`, 'utf8').trim()
      } catch {
        continue
      }
      m.pss += mem.pss
      m.rss += mem.rss
      // Everything but the sandbox's own plumbing (bwrap outside and as the namespace's init) is the agent.
      if (comm !== 'bwrap' && comm !== 'sh' && comm !== 'setpriv') m.agentPss += mem.pss
      m.processes.push(comm)
    }
    out.push(m)
  }
  return out
}

/** Collects garbage and lets the sandboxes settle before a measurement. */
export function settle(): Promise<void> {
  gc()
  return new Promise((r) => setTimeout(r, 2000))
}

/** How many sandboxes run which processes, e.g. `bash + bwrap + bwrap (50 sandboxes)`. */
export function describeProcesses(sandboxes: readonly SandboxMemory[]): string {
  const kinds = new Map<string, number>()
  for (const s of sandboxes) {
    const key = [...s.processes].sort().join(' + ')
    kinds.set(key, (kinds.get(key) ?? 0) + 1)
  }
  return [...kinds].map(([k, c]) => `${k} (${c} sandboxes)`).join('; ')
}
