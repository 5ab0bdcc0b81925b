import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { type Bench, progress, timedResult } from './lib/bench.js'
import { NodeHttpClient } from './lib/client.js'
import { cpuSpentMs, cpuTree } from './lib/cpu-tree.js'
import { EXAMPLES, packDir, REPO_ROOT, removeInstanceLeftovers } from './lib/server.js'
import { type Row, row } from './lib/stats.js'
import { PACED_GAP_MS, TURN_CASES, type TurnSender, turnSender } from './lib/turns.js'

const cliOf = (repo: string) => path.join(repo, 'packages', 'cli', 'bin', 'cairn.js')
const PAIRS = 300
const WARMUP = 30
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** Node options for the servers' processes (BENCH_SERVER_NODE_ARGS, e.g. `--cpu-prof --cpu-prof-dir=/tmp/p`). */
const nodeArgs = () => (process.env.BENCH_SERVER_NODE_ARGS ?? '').split(' ').filter(Boolean)

/** `cairn server` of `repo` in a process of its own (SQLite, fresh data dir, any port). */
async function startServerProcess(repo: string, dataDir: string) {
  const child = spawn(
    process.execPath,
    [...nodeArgs(), cliOf(repo), 'server', '--data-dir', dataDir, '--port', '0', '--json'],
    { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, CAIRN_LOG_LEVEL: 'error' } },
  )
  const lines = createInterface({ input: child.stdout })
  let started: { url: string; adminKeyPath: string } | undefined
  for await (const line of lines) {
    if (line.includes('"url"')) {
      started = JSON.parse(line) as { url: string; adminKeyPath: string }
      break
    }
  }
  if (!started) throw new Error('cairn server exited before it listened')
  const key = (await readFile(started.adminKeyPath, 'utf8')).trim()
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return
    child.kill('SIGTERM')
    await once(child, 'exit')
  }
  return { url: started.url, key, pid: child.pid as number, stop }
}

/** One server under test: its process, its client, its warm echo session. */
interface Subject {
  label: string
  client: NodeHttpClient
  sender: TurnSender
  healthz(): Promise<number>
  /** The server's process: its CPU, and its children's, is read around a loop. */
  pid: number
  close(): Promise<void>
}

async function startSubject(label: string, repo: string, problems: string[]): Promise<Subject> {
  const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-oop-'))
  const server = await startServerProcess(repo, dataDir)
  const client = new NodeHttpClient(server.url, server.key, 1)
  const close = async () => {
    client.close()
    await server.stop()
    await rm(dataDir, { recursive: true, force: true })
    await removeInstanceLeftovers(dataDir)
  }
  try {
    const deployed = await client.json('POST', '/v1/agents', await packDir(`${EXAMPLES}/echo`))
    if (deployed.status !== 201) throw new Error(`deploy failed: ${deployed.status}`)
    const created = await client.json('POST', '/v1/sessions', { agent: 'echo', keepWarmMs: 600_000 })
    if (created.status !== 201) throw new Error(`create failed: ${created.status}`)
    const echo = TURN_CASES[0] as (typeof TURN_CASES)[0]
    const sender = turnSender(created.body.id as string, echo, problems)
    const healthz = async () => {
      const res = await client.json('GET', '/healthz')
      if (res.status !== 200) throw new Error(`/healthz answered ${res.status}`)
      return res.ms
    }
    return { label, client, sender, healthz, pid: server.pid, close }
  } catch (error) {
    await close()
    throw error
  }
}

const CPU_ROUNDS = 10
const CPU_RUNS_PER_ROUND = 20

/**
 * CPU per request, of each server's process and of its children (the storage helpers, the
 * sandbox), by command: `CPU_ROUNDS` rounds of `CPU_RUNS_PER_ROUND` requests back to back per
 * server, the servers taking turns, the CPU their threads used meanwhile divided by the count. A
 * figure the load on a shared machine stretches less than wall time (it still makes each
 * instruction slower, alike for servers measured in turn).
 */
async function cpuPerRequest(
  subjects: readonly Subject[],
  request: (s: Subject) => Promise<unknown>,
): Promise<Map<string, number>[]> {
  const spent = subjects.map(() => new Map<string, number>())
  for (let round = 0; round < CPU_ROUNDS; round++)
    for (const [k, s] of subjects.entries()) {
      const before = cpuTree(s.pid)
      for (let i = 0; i < CPU_RUNS_PER_ROUND; i++) await request(s)
      const into = spent[k] as Map<string, number>
      for (const [comm, ms] of cpuSpentMs(before, cpuTree(s.pid)))
        into.set(comm, (into.get(comm) ?? 0) + ms / (CPU_ROUNDS * CPU_RUNS_PER_ROUND))
    }
  return spent
}

const cpuLine = (spent: Map<string, number>) => {
  const total = [...spent.values()].reduce((a, b) => a + b, 0)
  const parts = [...spent]
    .filter(([, ms]) => ms >= 0.005)
    .sort((a, b) => b[1] - a[1])
    .map(([comm, ms]) => `${comm} ${ms.toFixed(2)}`)
  return `${total.toFixed(2)} ms (${parts.join(', ')})`
}

/** The first quartile: a shared machine's load moves the medians most. */
const quartile = (xs: readonly number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 4)] as number

/**
 * Issue 33's warm turn, from outside: `cairn server` in its own process (SQLite), this process the
 * client, one keep-alive node:http connection per server. A warm echo turn (message POST ->
 * `run.completed`) and its floor, GET /healthz, alternate request by request, so both see the same
 * machine; back to back, then paced (25 ms of think time before each request). With
 * BENCH_BASELINE_REPO (another checkout, built), its server runs beside this one's, their
 * requests interleaved: before and after on the same machine at the same moments.
 */
export const warmTurnProcess: Bench = {
  name: 'warm-turn-process',
  description: 'warm echo turn ÷ GET /healthz, server in its own process, one keep-alive client',
  run: () =>
    timedResult('warm-turn-process', async () => {
      const problems: string[] = []
      const subjects: Subject[] = []
      try {
        subjects.push(await startSubject('this', REPO_ROOT, problems))
        const baseline = process.env.BENCH_BASELINE_REPO
        if (baseline) subjects.push(await startSubject('baseline', baseline, problems))
        for (let i = 0; i < WARMUP; i++)
          for (const s of subjects) {
            await s.healthz()
            await s.sender.send(s.client)
          }
        const measure = async (gapMs: number) => {
          const got = subjects.map(() => ({ floor: [] as number[], turns: [] as number[] }))
          for (let i = 0; i < PAIRS; i++)
            for (const [k, s] of subjects.entries()) {
              const into = got[k] as (typeof got)[0]
              if (gapMs) await sleep(gapMs)
              into.floor.push(await s.healthz())
              if (gapMs) await sleep(gapMs)
              into.turns.push((await s.sender.send(s.client)).completedMs as number)
            }
          return got
        }
        progress(`${PAIRS} pairs back to back, then ${PAIRS} paced, per server (${subjects.length})`)
        const runs = { 'back to back': await measure(0), paced: await measure(PACED_GAP_MS) }
        const healthzCpu = await cpuPerRequest(subjects, (s) => s.healthz())
        const turnCpu = await cpuPerRequest(subjects, (s) => s.sender.send(s.client))
        const cpu: Record<string, { healthz: Record<string, number>; turn: Record<string, number> }> = {}
        for (const [k, s] of subjects.entries())
          cpu[s.label] = {
            healthz: Object.fromEntries(healthzCpu[k] ?? []),
            turn: Object.fromEntries(turnCpu[k] ?? []),
          }
        if (problems.length > 0) throw new Error(problems.slice(0, 5).join('\n'))
        const rows: Row[] = []
        const notes: string[] = []
        const targets = []
        for (const [what, got] of Object.entries(runs))
          for (const [k, s] of subjects.entries()) {
            const { floor, turns } = got[k] as (typeof got)[0]
            const suffix = subjects.length > 1 ? ` (${s.label})` : ''
            const floorRow = row(`GET /healthz, ${what}${suffix}`, floor)
            const turnRow = row(`echo warm turn, ${what}${suffix}`, turns, {
              name: `healthz ${what}`,
              median: floorRow.summary.median,
            })
            rows.push(floorRow, turnRow)
            const ratio = turnRow.summary.median / floorRow.summary.median
            if (s.label === 'this')
              targets.push({
                name: `warm turn ÷ healthz, ${what} (issue 33)`,
                goal: '≤ 3×',
                value: ratio,
                met: ratio <= 3,
              })
            notes.push(
              `${what}${suffix}: first quartile ${quartile(turns).toFixed(2)} ms / ${quartile(floor).toFixed(2)} ms = ${(quartile(turns) / quartile(floor)).toFixed(1)}x`,
            )
          }
        for (const [label, { healthz, turn }] of Object.entries(cpu)) {
          const suffix = subjects.length > 1 ? ` (${label})` : ''
          notes.push(`CPU per GET /healthz${suffix}: ${cpuLine(new Map(Object.entries(healthz)))}`)
          notes.push(`CPU per echo warm turn${suffix}: ${cpuLine(new Map(Object.entries(turn)))}`)
        }
        return {
          config: {
            pairs: PAIRS,
            warmup: WARMUP,
            pacedGapMs: PACED_GAP_MS,
            database: 'sqlite',
            baseline: process.env.BENCH_BASELINE_REPO ?? null,
            cpuRuns: CPU_ROUNDS * CPU_RUNS_PER_ROUND,
            cpuPerRequestMs: cpu,
          },
          rows,
          targets,
          notes,
        }
      } finally {
        for (const s of subjects) await s.close()
      }
    }),
}
