import { type Bench, concurrently, progress, timedResult } from './lib/bench.js'
import {
  describeProcesses,
  MiB,
  measureSandboxes,
  memAvailable,
  serverHeap,
  settle,
  smaps,
} from './lib/memory.js'
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
        const baseHeap = serverHeap()
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
          const heapGrowth = (serverHeap() - baseHeap) / held
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
            { ...row(`${n}: server JS heap + external growth / N`, [heapGrowth / MiB]), unit: 'MiB' },
            { ...row(`${n}: MemAvailable drop / N`, [available / MiB]), unit: 'MiB' },
          )
          // The server's share: its RSS growth, or its heap growth when that is larger (RSS can shrink).
          const serverShare = Math.max(0, serverRss, heapGrowth) / MiB
          const perSession = rest.summary.median + serverShare
          targets.push({
            name: `memory per warm idle session, ${n} (issue 9)`,
            goal: 'sandbox PSS without the agent + server growth (RSS or heap) per session < 8 MiB',
            value: perSession,
            met: perSession < 8,
            unit: 'MiB',
          })
          notes.push(
            `${n}: processes per sandbox: ${describeProcesses(sandboxes)}; warming took ${(warmingMs / 1000).toFixed(1)} s`,
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
