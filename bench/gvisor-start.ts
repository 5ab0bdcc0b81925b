import { spawn } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import type { GvisorDriver } from '../packages/runtime/dist/index.js'
import { floor } from './baselines.js'
import { type Bench, progress, repeat, waitFor } from './lib/bench.js'
import { machineInfo } from './lib/machine.js'
import type { BenchResult, Target } from './lib/results.js'
import { type BenchServer, EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row } from './lib/stats.js'

const POOL_RUNS = 30
const COLD_RUNS = 12
const BWRAP_RUNS = 20
const WARMUP = 3

const CASES = [
  { name: 'echo', prompt: 'hello', expect: 'hello\n' },
  { name: 'notes', prompt: 'The bench ran', expect: 'Noted: The bench ran\n' },
] as const
type CaseName = (typeof CASES)[number]['name']

/** `runsc do /bin/true` with the driver's runsc, platform and flags: one sandbox booted and gone. */
export async function runscTrue(config: Pick<GvisorDriver['runsc'], 'path' | 'platform'>): Promise<number> {
  const root = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-runsc-'))
  try {
    const start = performance.now()
    const args = ['--root', root, `--platform=${config.platform}`, '--network=none', 'do', '/bin/true']
    await new Promise<void>((resolve, reject) => {
      const child = spawn(config.path, args, { stdio: 'ignore' })
      child.once('error', reject)
      child.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`runsc do exited ${code}`))))
    })
    return performance.now() - start
  } finally {
    await rm(root, { recursive: true, force: true })
  }
}

interface Sample {
  total: number
  /** Pool claims only: instants relative to the create request. */
  steps?: { claim: number; limits: number; binds: number; handOff: number; agent: number }
}

/** One new session and its first reply: create request to the first message.delta byte. */
async function once(
  server: BenchServer,
  c: (typeof CASES)[number],
  problems: string[],
  driver?: GvisorDriver,
): Promise<Sample | undefined> {
  const claimedBefore = driver?.poolStats.claimed ?? 0
  const a = performance.now()
  const session = await server.createSession(c.name)
  const b = performance.now()
  const t = await server.http.stream(`/v1/sessions/${session.id}/messages`, { prompt: c.prompt })
  await server.deleteSession(session.id)
  if (t.terminal !== 'run.completed' || t.firstDeltaMs === undefined || t.text !== c.expect) {
    problems.push(`${c.name}: ${t.status} ${t.terminal} ${t.error ?? ''} ${JSON.stringify(t.text)}`)
    return undefined
  }
  const total = b - a + t.firstDeltaMs
  const claim = driver?.poolStats.lastClaim
  if (!driver || !claim || driver.poolStats.claimed === claimedBefore) return { total }
  return {
    total,
    steps: {
      claim: claim.claimedAt - a,
      limits: claim.limitedAt - claim.claimedAt,
      binds: claim.boundAt - claim.limitedAt,
      handOff: claim.handedAt - claim.boundAt,
      agent: a + total - claim.handedAt,
    },
  }
}

/**
 * gVisor cold starts beside bwrap, through the server as in `cold-start`: new session to the first
 * byte of its first reply, from a pre-started pool slot (the pool refilled before each run, untimed)
 * and booted on demand (pool off), with each pool claim split into its steps; plus `runsc do
 * /bin/true` and bwrap in the same run as floors.
 */
export const gvisorStart: Bench = {
  name: 'gvisor-start',
  description: 'gVisor cold start (pool, on demand) with a step breakdown, beside bwrap',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const rows: Row[] = []
    const notes: string[] = []
    const targets: Target[] = []
    const problems: string[] = []
    const bwrapFloor = await floor('bwrap bash -c :')

    const pooled = await startBenchServer({ server: { isolation: 'gvisor', gvisorPoolSize: 2 } })
    let runscFloor: { name: string; median: number }
    let platform = ''
    try {
      const driver = pooled.server.runtime.drivers.gvisor as GvisorDriver
      for (const c of CASES) await pooled.deploy(`${EXAMPLES}/${c.name}`)
      // The first start of a layout boots cold and has the pool keep slots of it.
      for (let i = 0; i < WARMUP; i++) for (const c of CASES) await once(pooled, c, problems, driver)
      platform = driver.runsc.platform
      // Full: every layout's slots booted (the server's sessions use one layout; the node's default
      // layout keeps its own). Each run starts with the pool full again.
      await new Promise((r) => setTimeout(r, 3000))
      const full = driver.pooled
      const floorSamples: number[] = []
      for (let i = 0; i < 20; i++) floorSamples.push(await runscTrue(driver.runsc))
      runscFloor = { name: `runsc do /bin/true (${platform})`, median: row('', floorSamples).summary.median }
      rows.push(row(runscFloor.name, floorSamples))
      progress(`${POOL_RUNS} pooled cold starts per agent (${driver.describe()})`)
      const samples = new Map<CaseName, Sample[]>(CASES.map((c) => [c.name, []]))
      let missed = 0
      await repeat(POOL_RUNS, 180_000, async () => {
        for (const c of CASES) {
          // Measured with a slot ready: the refill's boot would otherwise compete for the 2 CPUs.
          await waitFor(() => driver.pooled >= full, 10_000)
          const s = await once(pooled, c, problems, driver)
          if (s?.steps) samples.get(c.name)?.push(s)
          else if (s) missed++
        }
      })
      if (missed > 0) notes.push(`${missed} pooled runs found no ready slot and were left out`)
      const { failed, lastFailure } = driver.poolStats
      if (failed > 0) notes.push(`${failed} pool claims failed and booted cold (last: ${lastFailure})`)
      for (const c of CASES) {
        const s = samples.get(c.name) ?? []
        const total = row(
          `gvisor pool, ${c.name}: create -> first byte`,
          s.map((x) => x.total),
          runscFloor,
        )
        rows.push(
          total,
          row(
            `  ${c.name}: server, create -> claim`,
            s.map((x) => x.steps?.claim ?? 0),
          ),
          row(
            `  ${c.name}: claim: cgroup limits`,
            s.map((x) => x.steps?.limits ?? 0),
          ),
          row(
            `  ${c.name}: claim: bind workspace, run dir, memory`,
            s.map((x) => x.steps?.binds ?? 0),
          ),
          row(
            `  ${c.name}: claim: command to the waiting init`,
            s.map((x) => x.steps?.handOff ?? 0),
          ),
          row(
            `  ${c.name}: agent start in gVisor -> first byte`,
            s.map((x) => x.steps?.agent ?? 0),
          ),
        )
        if (c.name === 'echo') {
          targets.push({
            name: 'gVisor cold start with the pool (issue 10)',
            goal: 'median < 100 ms',
            value: total.summary.median,
            met: total.summary.median < 100,
          })
        }
      }
    } finally {
      await pooled.close()
    }

    const cold = await startBenchServer({ server: { isolation: 'gvisor', gvisorPoolSize: 0 } })
    try {
      for (const c of CASES) await cold.deploy(`${EXAMPLES}/${c.name}`)
      for (const c of CASES) await once(cold, c, problems)
      progress(`${COLD_RUNS} on-demand gVisor cold starts per agent`)
      const samples = new Map<CaseName, number[]>(CASES.map((c) => [c.name, []]))
      await repeat(COLD_RUNS, 120_000, async () => {
        for (const c of CASES) {
          const s = await once(cold, c, problems)
          if (s) samples.get(c.name)?.push(s.total)
        }
      })
      for (const c of CASES) {
        rows.push(
          row(`gvisor on demand, ${c.name}: create -> first byte`, samples.get(c.name) ?? [], runscFloor),
        )
      }
    } finally {
      await cold.close()
    }

    const bwrap = await startBenchServer({ server: { isolation: 'bwrap' } })
    try {
      for (const c of CASES) await bwrap.deploy(`${EXAMPLES}/${c.name}`)
      for (const c of CASES) await once(bwrap, c, problems)
      progress(`${BWRAP_RUNS} bwrap cold starts per agent (same run)`)
      const samples = new Map<CaseName, number[]>(CASES.map((c) => [c.name, []]))
      await repeat(BWRAP_RUNS, 60_000, async () => {
        for (const c of CASES) {
          const s = await once(bwrap, c, problems)
          if (s) samples.get(c.name)?.push(s.total)
        }
      })
      for (const c of CASES) {
        rows.push(row(`bwrap, ${c.name}: create -> first byte`, samples.get(c.name) ?? [], bwrapFloor))
      }
    } finally {
      await bwrap.close()
    }
    if (problems.length > 0) throw new Error(`gvisor-start runs failed:\n${problems.slice(0, 10).join('\n')}`)
    return {
      bench: 'gvisor-start',
      startedAt,
      durationMs: performance.now() - t0,
      machine: machineInfo(),
      config: {
        poolRuns: POOL_RUNS,
        coldRuns: COLD_RUNS,
        bwrapRuns: BWRAP_RUNS,
        platform,
        runsc: process.env.CAIRN_RUNSC ?? 'runsc',
        measured:
          'create -> first byte: from the POST /v1/sessions request to the first message.delta of the first message (each session deleted, untimed, after its run); pool rows wait (untimed) until the pool is full before each run; steps are instants the pool records during the claim',
      },
      rows,
      targets,
      notes,
    }
  },
}
