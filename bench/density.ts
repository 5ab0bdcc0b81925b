import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { instanceRunDir } from '../packages/runtime/dist/index.js'
import { type BaselineName, measure as measureFloors } from './baselines.js'
import { type Bench, concurrently, progress, timedResult } from './lib/bench.js'
import { NodeHttpClient } from './lib/client.js'
import { MiB, measureSandboxes, memAvailable, smaps } from './lib/memory.js'
import type { Target } from './lib/results.js'
import { EXAMPLES, packDir, REPO_ROOT, removeInstanceLeftovers } from './lib/server.js'
import { type Row, row, summarize } from './lib/stats.js'

/** Warm idle sessions held at each step, after a step with none (BENCH_DENSITY_SESSIONS=10,1000,10000). */
const STEPS = (process.env.BENCH_DENSITY_SESSIONS ?? '10,1000').split(',').map(Number)
/** Sessions warmed at once (BENCH_DENSITY_CONCURRENCY). */
const CONCURRENCY = Number(process.env.BENCH_DENSITY_CONCURRENCY ?? 2)
const COLD_RUNS = 20
const WARM_RUNS = 100
/** Warming is timed per block of this many sessions: a rate that falls shows what grows. */
const BLOCK = 250
/**
 * Time allowed for warming, over all steps (BENCH_DENSITY_WARM_BUDGET_S): on a shared machine a
 * step stops where the budget ends and is measured at what it holds, saying so.
 */
const WARM_BUDGET_MS = Number(process.env.BENCH_DENSITY_WARM_BUDGET_S ?? 900) * 1000
/** Stop adding sessions when the machine has less than this available. */
const MIN_AVAILABLE_BYTES = 3 * 1024 ** 3
const HOUR_MS = 3_600_000
/**
 * Servers holding the sessions, round robin (BENCH_DENSITY_SERVERS): a server holds one
 * descriptor per warm session (five before issue 33's cut), so one needs a descriptor limit above
 * its sessions; cold starts and warm turns are measured on the first.
 */
const SERVERS = Number(process.env.BENCH_DENSITY_SERVERS ?? 1)
/** Whose `cairn server` runs (BENCH_DENSITY_REPO: another checkout, built, for a before figure). */
const SERVER_REPO = process.env.BENCH_DENSITY_REPO ?? REPO_ROOT
/**
 * kernel.pid_max for the run (BENCH_DENSITY_PID_MAX, where the machine lets this process write
 * it): set before the servers start, set back after; 3 pids a warm sandbox.
 */
const PID_MAX = Number(process.env.BENCH_DENSITY_PID_MAX ?? 0)
/** Floors measured beside each step (bench/baselines.ts). */
const FLOORS: BaselineName[] = ['bash -c :', 'bwrap bash -c :', 'driver /bin/true (+cgroups)']
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/**
 * `cairn server` in a process of its own (SQLite, fresh data dir), its per-tenant sandbox cap above
 * the sessions held, and a client of its own.
 */
async function startServer(maxSandboxes: number) {
  const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-density-'))
  const cli = path.join(SERVER_REPO, 'packages', 'cli', 'bin', 'cairn.js')
  const child = spawn(process.execPath, [cli, 'server', '--data-dir', dataDir, '--port', '0', '--json'], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, CAIRN_LOG_LEVEL: 'error', CAIRN_MAX_SANDBOXES_PER_TENANT: String(maxSandboxes) },
  })
  let started: { url: string; adminKeyPath: string } | undefined
  for await (const line of createInterface({ input: child.stdout })) {
    if (line.includes('"url"')) {
      started = JSON.parse(line) as { url: string; adminKeyPath: string }
      break
    }
  }
  const close = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM')
      await once(child, 'exit')
    }
    await rm(dataDir, { recursive: true, force: true })
    await removeInstanceLeftovers(dataDir)
  }
  if (!started || child.pid === undefined) {
    await close()
    throw new Error('cairn server exited before it listened')
  }
  const key = (await readFile(started.adminKeyPath, 'utf8')).trim()
  const client = new NodeHttpClient(started.url, key, 16)
  const deployed = await client.json('POST', '/v1/agents', await packDir(`${EXAMPLES}/echo`))
  if (deployed.status !== 201) throw new Error(`deploy failed: ${deployed.status}`)
  return {
    dataDir,
    pid: child.pid,
    client,
    close: async () => {
      client.close()
      await close()
    },
  }
}

type Server = Awaited<ReturnType<typeof startServer>>

/** Processes and threads in these instances' sandbox cgroups (the `pids` hierarchy). */
function sandboxTasks(dataDirs: readonly string[]): { processes: number; threads: number; cgroups: number } {
  let processes = 0
  let threads = 0
  let cgroups = 0
  for (const dataDir of dataDirs) {
    const dir = path.join('/sys/fs/cgroup/pids/cairn', path.basename(instanceRunDir(dataDir)))
    // A server that has started no sandbox yet has no scope.
    if (!existsSync(dir)) continue
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      if (!e.isDirectory()) continue
      const lines = (file: string) =>
        readFileSync(path.join(dir, e.name, file), 'utf8')
          .split('\n')
          .filter(Boolean)
      const procs = lines('cgroup.procs').length
      if (procs === 0) continue
      cgroups++
      processes += procs
      threads += lines('tasks').length
    }
  }
  return { processes, threads, cgroups }
}

const count = (file: string) => readFileSync(file, 'utf8').split('\n').filter(Boolean).length
const fds = (pid: number) => readdirSync(`/proc/${pid}/fd`).length
/** Threads on the whole machine (each one takes a pid), from /proc/loadavg. */
const machineTasks = () => Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[3]?.split('/')[1])

/**
 * Issue 33's density: N warm idle echo sessions held by `cairn server` (bwrap), and what a
 * cold start (create -> first byte) and a warm turn on a random held session cost beside them, at
 * 0, then at each step; per held session: memory, processes, threads, descriptors and mounts.
 */
export const density: Bench = {
  name: 'density',
  description: `cold start and warm turn beside 0, ${STEPS.join(', ')} warm idle echo sessions`,
  run: () =>
    timedResult('density', async () => {
      const servers: Server[] = []
      const rows: Row[] = []
      const notes: string[] = []
      const targets: Target[] = []
      /** The held sessions, by server. */
      const held: { server: Server; id: string }[] = []
      const coldMedians = new Map<number, number>()
      const warmRatios = new Map<number, number>()
      const create = async (server: Server, keepWarmMs: number) => {
        const res = await server.client.json('POST', '/v1/sessions', {
          agent: 'echo',
          keepWarmMs,
          idleTimeoutMs: 6 * HOUR_MS,
        })
        if (res.status !== 201) throw new Error(`create: ${res.status} ${JSON.stringify(res.body)}`)
        return { id: res.body.id as string, ms: res.ms }
      }
      const turn = async (server: Server, id: string, prompt: string) => {
        const t = await server.client.stream(`/v1/sessions/${id}/messages`, { prompt })
        if (t.terminal !== 'run.completed' || t.text !== `${prompt}\n`)
          throw new Error(`turn on ${id}: ${t.status} ${t.terminal} ${t.error ?? ''}`)
        return t
      }
      const pidMaxBefore = Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8'))
      if (PID_MAX > 0) writeFileSync('/proc/sys/kernel/pid_max', String(PID_MAX))
      try {
        const cap = Math.ceil(Math.max(...STEPS) / SERVERS) + COLD_RUNS + 100
        for (let k = 0; k < SERVERS; k++) servers.push(await startServer(cap))
        let first = servers[0] as Server
        const baseFds = servers.map((s) => fds(s.pid))
        const baseRss = servers.map((s) => smaps(s.pid)?.rss ?? 0)
        const baseAvailable = memAvailable()
        // Warm-up (statements, JIT), then the empty machine's figures.
        for (let i = 0; i < 5; i++) await turn(first, (await create(first, 0)).id, `warm-up ${i}`)
        const measure = async (n: number, name?: string) => {
          await sleep(2000)
          const label = name ?? `N=${n.toLocaleString('en-US')}`
          const cold: number[] = []
          for (let i = 0; i < COLD_RUNS; i++) {
            // keepWarmMs 0: the sandbox stops after its turn, so N stays what it is.
            const { id, ms } = await create(first, 0)
            const t = await turn(first, id, `cold ${i}`)
            if (t.coldStart !== true) throw new Error(`cold start ${i} found a warm sandbox`)
            cold.push(ms + (t.firstDeltaMs as number))
            await sleep(100)
          }
          // The machine's part of a start beside these sandboxes, outside any server: a process,
          // an empty sandbox with the driver's arguments, the same with its cgroups made.
          for (const floorRow of await measureFloors(FLOORS, 10))
            rows.push({ ...floorRow, name: `${label}: ${floorRow.name}` })
          progress(
            rows
              .slice(-FLOORS.length)
              .map((r) => `${r.name} ${r.summary.median.toFixed(1)} ms`)
              .join('; '),
          )
          const coldRow = row(`${label}: cold start, create -> first byte`, cold)
          progress(
            `${coldRow.name}: median ${coldRow.summary.median.toFixed(1)} ms, p99 ${coldRow.summary.p99.toFixed(1)} ms`,
          )
          coldMedians.set(name ? -1 : n, coldRow.summary.median)
          rows.push(coldRow)
          const mine = held.filter((h) => h.server === first)
          if (mine.length > 0) {
            const floor: number[] = []
            const warm: number[] = []
            for (let i = 0; i < WARM_RUNS; i++) {
              await sleep(25)
              floor.push((await first.client.json('GET', '/healthz')).ms)
              await sleep(25)
              const { id } = mine[Math.floor(Math.random() * mine.length)] as { id: string }
              const t = await turn(first, id, `warm ${i}`)
              if (t.coldStart !== false) throw new Error(`the warm turn on ${id} started its sandbox`)
              warm.push(t.completedMs as number)
            }
            const floorRow = row(`${label}: GET /healthz, paced`, floor)
            const warmRow = row(`${label}: warm turn on a random held session, paced`, warm, {
              name: 'healthz',
              median: floorRow.summary.median,
            })
            warmRatios.set(n, warmRow.summary.median / floorRow.summary.median)
            progress(
              `${warmRow.name}: median ${warmRow.summary.median.toFixed(2)} ms (healthz ${floorRow.summary.median.toFixed(2)} ms)`,
            )
            rows.push(floorRow, warmRow)
          }
          const tasks = sandboxTasks(servers.map((s) => s.dataDir))
          const sum = (xs: number[]) => xs.reduce((x, y) => x + y, 0)
          const fdsNow = sum(servers.map((s, k) => fds(s.pid) - (baseFds[k] as number)))
          const rssNow = sum(servers.map((s, k) => (smaps(s.pid)?.rss ?? 0) - (baseRss[k] as number)))
          const per = (x: number) => (n > 0 ? x / n : 0)
          const one = (name: string, value: number, unit: string) => ({
            ...row(`${label}: ${name}`, [value]),
            unit,
          })
          rows.push(
            one('processes per warm sandbox', per(tasks.processes), 'count'),
            one('threads (pids) per warm sandbox', per(tasks.threads), 'count'),
            one('server descriptors per session', per(fdsNow), 'count'),
            one('server RSS growth / N', per(rssNow) / MiB, 'MiB'),
            one('MemAvailable drop / N', per(baseAvailable - memAvailable()) / MiB, 'MiB'),
            one("mounts in the host's table", count('/proc/self/mountinfo'), 'count'),
            one('threads on the machine', machineTasks(), 'count'),
          )
          if (n > 0 && n <= 1000) {
            const sandboxes = measureSandboxes(first.dataDir)
            rows.push(
              {
                ...row(
                  `${label}: sandbox PSS`,
                  sandboxes.map((s) => s.pss / MiB),
                ),
                unit: 'MiB',
              },
              {
                ...row(
                  `${label}: sandbox memory cgroup charge`,
                  sandboxes.map((s) => s.cgroupUsage / MiB),
                ),
                unit: 'MiB',
              },
            )
          }
          progress(
            rows
              .slice(-7)
              .map((r) => `${r.name} ${r.summary.median.toFixed(2)}`)
              .join('; '),
          )
          notes.push(
            `${label}: ${tasks.cgroups} sandbox cgroups, ${tasks.processes} processes, ${tasks.threads} threads; servers ${servers.map((s) => fds(s.pid)).join('/')} fds; MemAvailable ${(memAvailable() / 1024 ** 3).toFixed(1)} GiB`,
          )
        }
        progress('N=0')
        await measure(0)
        const warmDeadline = performance.now() + WARM_BUDGET_MS
        for (const target of STEPS) {
          progress(`warming sessions ${held.length + 1}-${target}, ${CONCURRENCY} at a time`)
          let stopped = false
          while (held.length < target && !stopped) {
            const from = held.length
            const size = Math.min(BLOCK, target - from)
            const firstTurns: number[] = []
            const a = performance.now()
            await concurrently(size, CONCURRENCY, async (i) => {
              const server = servers[(from + i) % SERVERS] as Server
              const { id } = await create(server, HOUR_MS * 6)
              firstTurns.push((await turn(server, id, `session ${from + i}`)).completedMs as number)
              held.push({ server, id })
            })
            const seconds = (performance.now() - a) / 1000
            const s = summarize(firstTurns)
            notes.push(
              `warming ${from + 1}-${held.length}: ${(size / seconds).toFixed(1)} sessions/s, first turn median ${s.median.toFixed(1)} ms, p99 ${s.p99.toFixed(1)} ms`,
            )
            progress(notes.at(-1) as string)
            if (memAvailable() < MIN_AVAILABLE_BYTES) {
              notes.push(`stopped at ${held.length} sessions: less than 3 GiB available`)
              stopped = true
            } else if (performance.now() > warmDeadline) {
              notes.push(
                `stopped at ${held.length} sessions: the warming budget (${WARM_BUDGET_MS / 1000} s) ran out`,
              )
              stopped = true
            }
          }
          progress(`N=${held.length}`)
          await measure(held.length)
          if (stopped) break
        }
        // The empty machine again, once every held sandbox is gone: the load of a shared machine
        // moves over a long run, so the first N = 0 alone is no fair floor.
        progress('stopping the held sessions')
        for (const server of servers.splice(0)) await server.close()
        held.splice(0)
        const again = await startServer(COLD_RUNS + 100)
        servers.push(again)
        first = again
        for (let i = 0; i < 5; i++) await turn(again, (await create(again, 0)).id, `warm-up ${i}`)
        progress('N=0, after')
        await measure(0, 'N=0 after')
        const empty = Math.min(coldMedians.get(0) as number, coldMedians.get(-1) as number)
        notes.push(
          `cold start beside none: ${(coldMedians.get(0) as number).toFixed(1)} ms first, ${(coldMedians.get(-1) as number).toFixed(1)} ms after; the smaller is the floor`,
        )
        for (const [n, median] of coldMedians)
          if (n > 0)
            targets.push({
              name: `cold start beside ${n} warm sessions ÷ beside none (issue 33)`,
              goal: '≤ 2×',
              value: median / empty,
              unit: '×',
              met: median / empty <= 2,
            })
        const atTen = warmRatios.get(10)
        if (atTen !== undefined)
          for (const [n, ratio] of warmRatios)
            if (n > 10)
              targets.push({
                name: `warm turn ÷ healthz beside ${n} ÷ the same beside 10 (issue 33)`,
                goal: '≤ 2×',
                value: ratio / atTen,
                unit: '×',
                met: ratio / atTen <= 2,
              })
        return {
          config: {
            steps: STEPS,
            concurrency: CONCURRENCY,
            coldRuns: COLD_RUNS,
            warmRuns: WARM_RUNS,
            agent: 'examples/echo (bash)',
            servers: SERVERS,
            server: 'cairn server in its own process (SQLite)',
            serverOpenFiles: /^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1],
            serverRepo: SERVER_REPO,
            pidMax: Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8')),
            pidMaxAtStart: pidMaxBefore,
          },
          rows,
          targets,
          notes,
        }
      } finally {
        for (const server of servers) await server.close()
        if (PID_MAX > 0) writeFileSync('/proc/sys/kernel/pid_max', String(pidMaxBefore))
      }
    }),
}
