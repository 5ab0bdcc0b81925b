import { existsSync, readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import v8 from 'node:v8'
import vm from 'node:vm'
import { instanceRunDir } from '../packages/runtime/dist/index.js'
import { type Bench, concurrently, progress, timedResult } from './lib/bench.js'
import type { Target } from './lib/results.js'
import { type BenchServer, EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row, summarize } from './lib/stats.js'

/** Warm idle sessions held at each step (override: BENCH_IDLE_SESSIONS=200,1000). */
const STEPS = (process.env.BENCH_IDLE_SESSIONS ?? '200,1000').split(',').map(Number)
/**
 * Sessions are warmed one at a time, so each cold start runs alone (and because, before 876f3e7,
 * concurrent first turns of one agent raced on MemoryService.bind's temporary file).
 */
const CONCURRENCY = 1
/** Stop adding sessions when the machine has less than this available. */
const MIN_AVAILABLE_BYTES = 4 * 1024 ** 3
const MiB = 1024 * 1024

v8.setFlagsFromString('--expose-gc')
const gc = vm.runInNewContext('gc') as () => void

/** Rss and Pss of a process, in bytes (/proc/<pid>/smaps_rollup), or undefined once it is gone. */
function smaps(pid: number | 'self'): { rss: number; pss: number } | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8')
    const kib = (field: string) =>
      Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? 0) * 1024
    return { rss: kib('Rss'), pss: kib('Pss') }
  } catch {
    return undefined
  }
}

function memAvailable(): number {
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? 0) * 1024
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

interface SandboxMemory {
  pss: number
  rss: number
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

/** Sums smaps_rollup over the processes of each sandbox cgroup; the agent is what is not bwrap. */
function measureSandboxes(dataDir: string): SandboxMemory[] {
  const { dirs, usageFile } = sandboxCgroups(dataDir)
  const out: SandboxMemory[] = []
  for (const dir of dirs) {
    const pids = readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number)
    if (pids.length === 0) continue
    // A spare launcher waiting for its command (a fixed pool of the server's, not a session's).
    if (pids.length === 1 && isSpareLauncher(pids[0] as number)) continue
    const m: SandboxMemory = {
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

function settle(): Promise<void> {
  gc()
  return new Promise((r) => setTimeout(r, 2000))
}

/**
 * N warm idle echo sessions (one turn each, keepWarmMs an hour), then the memory they hold: the
 * PSS and RSS of the processes in each sandbox's cgroup (smaps_rollup), the cgroup's own charge
 * (which includes kernel memory), the growth of this process (the server, in-process) and of the
 * machine's MemAvailable, per session.
 */
export const idleMemory: Bench = {
  name: 'idle-memory',
  description: `memory per warm idle session (${STEPS.join(', ')} echo sessions)`,
  run: () =>
    timedResult('idle-memory', async () => {
      const server: BenchServer = await startBenchServer()
      try {
        await server.deploy(`${EXAMPLES}/echo`)
        // Warm-up: the server's lazy state (statements, JIT) before the baseline.
        for (let i = 0; i < 5; i++) {
          const { id } = await server.createSession('echo')
          await server.http.stream(`/v1/sessions/${id}/messages`, { prompt: 'warm-up' })
          await server.deleteSession(id)
        }
        await settle()
        const baseServer = smaps('self') as { rss: number; pss: number }
        const heap = () => {
          const m = process.memoryUsage()
          return m.heapUsed + m.external
        }
        const baseHeap = heap()
        const baseAvailable = memAvailable()
        const rows: Row[] = []
        const targets: Target[] = []
        const notes: string[] = []
        const config: Record<string, unknown> = {
          steps: STEPS,
          concurrency: CONCURRENCY,
          agent: 'examples/echo (bash)',
          session: 'keepWarmMs 3,600,000, one turn each, then idle',
          measured:
            'per sandbox cgroup: sum of Pss/Rss of its processes from /proc/<pid>/smaps_rollup, and the cgroup memory charge; server: Rss/Pss growth of this process (the server runs in it) since before the first session; machine: MemAvailable drop',
        }
        let held = 0
        const startMs: number[] = []
        for (const target of STEPS) {
          if (memAvailable() < MIN_AVAILABLE_BYTES) {
            notes.push(`stopped at ${held} sessions: less than 4 GiB available`)
            break
          }
          progress(`warming sessions ${held + 1}-${target}, one at a time`)
          const from = held
          const a = performance.now()
          await concurrently(target - from, CONCURRENCY, async (i) => {
            const { id } = await server.createSession('echo', { keepWarmMs: 3_600_000 })
            const t = await server.http.stream(`/v1/sessions/${id}/messages`, {
              prompt: `session ${from + i}`,
            })
            if (t.terminal !== 'run.completed')
              throw new Error(`turn failed: ${t.status} ${t.terminal} ${t.error}`)
            startMs.push(t.completedMs as number)
            held++
          })
          const warmingMs = performance.now() - a
          await settle()
          const sandboxes = measureSandboxes(server.dataDir)
          if (sandboxes.length !== held)
            notes.push(`${held} sessions but ${sandboxes.length} live sandbox cgroups`)
          const srv = smaps('self') as { rss: number; pss: number }
          const serverRss = (srv.rss - baseServer.rss) / held
          const serverPss = (srv.pss - baseServer.pss) / held
          const serverHeap = (heap() - baseHeap) / held
          const available = (baseAvailable - memAvailable()) / held
          const mib = (values: number[]) => values.map((v) => v / MiB)
          const n = `N=${held}`
          const rest = row(
            `${n}: sandbox PSS without the agent (bwrap x2)`,
            mib(sandboxes.map((s) => s.pss - s.agentPss)),
          )
          rows.push(
            { ...row(`${n}: sandbox PSS per session`, mib(sandboxes.map((s) => s.pss))), unit: 'MiB' },
            {
              ...row(`${n}: agent process (bash echo.sh) PSS`, mib(sandboxes.map((s) => s.agentPss))),
              unit: 'MiB',
            },
            { ...rest, unit: 'MiB' },
            { ...row(`${n}: sandbox RSS per session`, mib(sandboxes.map((s) => s.rss))), unit: 'MiB' },
            {
              ...row(`${n}: sandbox memory cgroup charge`, mib(sandboxes.map((s) => s.cgroupUsage))),
              unit: 'MiB',
            },
            { ...row(`${n}: server RSS growth / N`, [serverRss / MiB]), unit: 'MiB' },
            { ...row(`${n}: server PSS growth / N`, [serverPss / MiB]), unit: 'MiB' },
            { ...row(`${n}: server JS heap + external growth / N`, [serverHeap / MiB]), unit: 'MiB' },
            { ...row(`${n}: MemAvailable drop / N`, [available / MiB]), unit: 'MiB' },
          )
          // The server's share: its RSS growth, or its heap growth when that is larger (RSS can shrink).
          const serverShare = Math.max(0, serverRss, serverHeap) / MiB
          const perSession = rest.summary.median + serverShare
          targets.push({
            name: `memory per warm idle session, ${n} (issue 9)`,
            goal: 'sandbox PSS without the agent + server growth (RSS or heap) per session < 8 MiB',
            value: perSession,
            met: perSession < 8,
            unit: 'MiB',
          })
          const kinds = new Map<string, number>()
          for (const s of sandboxes) {
            const key = s.processes.sort().join(' + ')
            kinds.set(key, (kinds.get(key) ?? 0) + 1)
          }
          notes.push(
            `${n}: processes per sandbox: ${[...kinds].map(([k, c]) => `${k} (${c} sandboxes)`).join('; ')}; warming took ${(warmingMs / 1000).toFixed(1)} s`,
            `${n}: per session, sandbox PSS without the agent ${rest.summary.median.toFixed(2)} MiB + server ${serverShare.toFixed(2)} MiB = ${perSession.toFixed(2)} MiB; with the agent ${(summarize(mib(sandboxes.map((s) => s.pss))).median + serverShare).toFixed(2)} MiB; MemAvailable drop ${(available / MiB).toFixed(2)} MiB`,
          )
        }
        rows.push(row('first turn while warming (message POST -> run.completed)', startMs))
        config.held = held
        config.serverBaseline = { rssMiB: baseServer.rss / MiB, pssMiB: baseServer.pss / MiB }
        return {
          config,
          rows,
          targets,
          notes,
        }
      } finally {
        progress('closing the server (stops every sandbox)')
        await server.close()
      }
    }),
}
