import type { GvisorDriver } from '../packages/runtime/dist/index.js'
import { floor } from './baselines.js'
import { runscTrue } from './gvisor-start.js'
import { type Bench, progress, timedResult, waitFor } from './lib/bench.js'
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
import { fmtMs, fmtRatio, type Row, ratio, row } from './lib/stats.js'
import { healthzSamples, PACED_GAP_MS, pacedTurns, roundTrips, TURN_CASES, turnSender } from './lib/turns.js'

/** Paced warm turns per agent and driver (override: BENCH_DRIVERS_TURNS=20). */
const TURNS = Number(process.env.BENCH_DRIVERS_TURNS ?? 200)
const WARMUP = 20
const FLOOR_RUNS = 200
/** Warm idle echo sessions held per driver (override: BENCH_DRIVERS_SESSIONS=5). */
const SESSIONS = Number(process.env.BENCH_DRIVERS_SESSIONS ?? 50)
/** gVisor pool slots kept ready per layout, as the server's default with gVisor as the default driver. */
const GVISOR_POOL_SIZE = 2
/** Stop adding sessions when the machine has less than this available. */
const MIN_AVAILABLE_BYTES = 4 * 1024 ** 3

type DriverName = 'bwrap' | 'gvisor'
const DRIVERS: readonly DriverName[] = ['bwrap', 'gvisor']

/** One figure of the side-by-side table, measured on each driver (a row per driver). */
interface Figure {
  label: string
  unit?: string
  rows: Partial<Record<DriverName, Row>>
}

/** What one driver's server measured: its figures by label, in table order. */
type Measured = Map<string, Row>

/**
 * One server with `driver` as its default isolation: the HTTP floor, paced warm turns on one
 * session per agent, then SESSIONS new echo sessions, each from create to the first byte of its
 * first reply (a cold start, with a gVisor pool slot ready), kept warm and idle for the memory
 * they hold. Returns undefined (and says why in `notes`) when the driver cannot run here.
 */
async function measureDriver(driver: DriverName, notes: string[]): Promise<Measured | undefined> {
  const coldFloor = driver === 'bwrap' ? await floor('bwrap bash -c :') : undefined
  let server: BenchServer
  try {
    server = await startBenchServer({
      server:
        driver === 'gvisor'
          ? { isolation: 'gvisor', gvisorPoolSize: GVISOR_POOL_SIZE }
          : { isolation: 'bwrap' },
    })
  } catch (error) {
    notes.push(
      `${driver} skipped: the server did not start (${error instanceof Error ? error.message : error})`,
    )
    return undefined
  }
  const out: Measured = new Map()
  const add = (label: string, r: Row, unit?: string) => out.set(label, unit ? { ...r, unit } : r)
  try {
    // An installed runsc can still fail on this kernel: the runtime's self test starts a sandbox.
    if (driver === 'gvisor') {
      const state = (await server.server.runtime.isolations()).find((i) => i.name === driver)
      if (!state?.available) {
        notes.push(`${driver} skipped: ${state?.reason ?? 'not available on this node'}`)
        return undefined
      }
    }
    const gvisor = driver === 'gvisor' ? (server.server.runtime.drivers.gvisor as GvisorDriver) : undefined
    notes.push(`${driver}: ${server.server.runtime.driver.describe()}`)
    for (const c of TURN_CASES) await server.deploy(`${EXAMPLES}/${c.name}`)

    progress(`${driver}: HTTP floor, GET /healthz x ${FLOOR_RUNS}`)
    const healthz = row('GET /healthz (node:http)', await healthzSamples(server.http, FLOOR_RUNS))
    const httpFloor = { name: 'healthz', median: healthz.summary.median }
    add(healthz.name, healthz)

    for (const c of TURN_CASES) {
      progress(
        `${driver}, ${c.name}: ${WARMUP} warm-up turns, ${TURNS} paced (${PACED_GAP_MS} ms think time)`,
      )
      const session = await server.createSession(c.name, { keepWarmMs: 10 * 60_000 })
      const problems: string[] = []
      const sender = turnSender(session.id, c, problems)
      for (let i = 0; i < WARMUP; i++) await sender.send(server.http)
      const paced = await pacedTurns(sender, server.http, TURNS, PACED_GAP_MS, 120_000)
      await server.deleteSession(session.id)
      if (problems.length > 0)
        throw new Error(`${driver} ${c.name} turns failed:\n${problems.slice(0, 10).join('\n')}`)
      if (paced.truncated) notes.push(`${driver} ${c.name}: paced turns stopped by the time budget`)
      add(`${c.name}: paced warm turn (node:http)`, row('', roundTrips(paced.timings), httpFloor))
      add(
        `${c.name}: paced server durationMs`,
        row(
          '',
          paced.timings.map((t) => t.serverDurationMs as number),
        ),
      )
    }

    // With gVisor, each cold start claims a ready slot: wait (untimed) until the pool is full again.
    let full = 0
    if (gvisor) {
      await new Promise((r) => setTimeout(r, 3000))
      full = gvisor.pooled
    }
    const poolFull = () => (gvisor ? waitFor(() => gvisor.pooled >= full, 10_000) : Promise.resolve(true))
    await poolFull()
    await settle()
    const baseServer = smaps('self') as { rss: number; pss: number }
    const baseHeap = serverHeap()
    const baseAvailable = memAvailable()
    const claimedBefore = gvisor?.poolStats.claimed ?? 0
    progress(`${driver}: ${SESSIONS} echo sessions, each created and warmed alone, kept warm`)
    const echo = TURN_CASES.find((c) => c.name === 'echo') ?? (TURN_CASES[0] as (typeof TURN_CASES)[number])
    const coldStarts: number[] = []
    const problems: string[] = []
    let held = 0
    for (let i = 0; i < SESSIONS; i++) {
      if (memAvailable() < MIN_AVAILABLE_BYTES) {
        notes.push(`${driver}: stopped at ${held} sessions: less than 4 GiB available`)
        break
      }
      await poolFull()
      const a = performance.now()
      const session = await server.createSession('echo', { keepWarmMs: 3_600_000 })
      const b = performance.now()
      const t = await server.http.stream(`/v1/sessions/${session.id}/messages`, { prompt: echo.prompt(i) })
      if (t.terminal !== 'run.completed' || t.firstDeltaMs === undefined || t.text !== echo.expect(i)) {
        problems.push(`session ${i}: ${t.status} ${t.terminal} ${t.error ?? ''} ${JSON.stringify(t.text)}`)
        continue
      }
      coldStarts.push(b - a + t.firstDeltaMs)
      held++
    }
    if (problems.length > 0)
      throw new Error(`${driver} idle sessions failed:\n${problems.slice(0, 10).join('\n')}`)
    if (gvisor) {
      const claimed = gvisor.poolStats.claimed - claimedBefore
      if (claimed < held)
        notes.push(`gvisor: ${held - claimed} of ${held} cold starts found no ready pool slot`)
    }
    const coldFloorNow = coldFloor ?? (await runscFloor(gvisor as GvisorDriver))
    add('echo: cold start, create -> first byte', row('', coldStarts, coldFloorNow))

    // The pool refilled (its slots are the server's, held before and after alike), then measure.
    await poolFull()
    await settle()
    const sandboxes = measureSandboxes(server.dataDir)
    if (sandboxes.length !== held)
      notes.push(`${driver}: ${held} sessions but ${sandboxes.length} sandbox cgroups`)
    const srv = smaps('self') as { rss: number; pss: number }
    const mib = (values: number[]) => values.map((v) => v / MiB)
    const perSession = (bytes: number) => [bytes / held / MiB]
    add('echo idle: sandbox PSS per session', row('', mib(sandboxes.map((s) => s.pss))), 'MiB')
    add('echo idle: sandbox RSS per session', row('', mib(sandboxes.map((s) => s.rss))), 'MiB')
    add('echo idle: sandbox memory cgroup charge', row('', mib(sandboxes.map((s) => s.cgroupUsage))), 'MiB')
    add('echo idle: server RSS growth / N', row('', perSession(srv.rss - baseServer.rss)), 'MiB')
    add(
      'echo idle: server JS heap + external growth / N',
      row('', perSession(serverHeap() - baseHeap)),
      'MiB',
    )
    add('echo idle: MemAvailable drop / N', row('', perSession(baseAvailable - memAvailable())), 'MiB')
    notes.push(`${driver}: N=${held} idle sessions; processes per sandbox: ${describeProcesses(sandboxes)}`)
    return out
  } finally {
    progress(`${driver}: closing the server (stops every sandbox)`)
    await server.close()
  }
}

/** `runsc do /bin/true` with the driver's runsc: one gVisor sandbox booted and gone. */
async function runscFloor(driver: GvisorDriver): Promise<{ name: string; median: number }> {
  const samples: number[] = []
  for (let i = 0; i < 20; i++) samples.push(await runscTrue(driver.runsc))
  return { name: `runsc do /bin/true (${driver.runsc.platform})`, median: row('', samples).summary.median }
}

/** The figures with one column per driver, each with its ratio to its floor, and gVisor over bwrap. */
function printSideBySide(figures: readonly Figure[]): string[] {
  const cell = (r: Row | undefined) => {
    if (!r) return 'skipped'
    const x = ratio(r)
    return `${fmtMs(r.summary.median)}${x === undefined ? '' : ` (${fmtRatio(x)}x floor)`}`
  }
  const header = ['median (ms unless [unit])', ...DRIVERS, 'gvisor / bwrap']
  const lines = figures.map((f) => {
    const { bwrap, gvisor } = f.rows
    // A ratio only between positive figures (a growth divided by N can be negative at small N).
    const over =
      bwrap && gvisor && bwrap.summary.median > 0 && gvisor.summary.median > 0
        ? gvisor.summary.median / bwrap.summary.median
        : undefined
    return [
      f.unit ? `${f.label} [${f.unit}]` : f.label,
      ...DRIVERS.map((d) => cell(f.rows[d])),
      over === undefined ? '' : `${fmtRatio(over)}x`,
    ]
  })
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((l) => (l[i] as string).length)))
  const fmt = (cells: string[]) =>
    cells
      .map((c, i) => (i === 0 ? c.padEnd(widths[i] as number) : c.padStart(widths[i] as number)))
      .join('  ')
  const text = [
    '',
    'drivers side by side',
    fmt(header),
    widths.map((w) => '-'.repeat(w)).join('  '),
    ...lines.map(fmt),
  ]
  for (const line of text) console.log(line)
  return text.slice(2)
}

/**
 * bwrap and gVisor side by side, each as the server's default driver in its own server: warm
 * turns (echo, notes), cold starts and memory per warm idle session (echo), measured as in
 * `warm-turn`, `gvisor-start` and `idle-memory`.
 */
export const drivers: Bench = {
  name: 'drivers',
  description: `bwrap and gVisor side by side: warm turn, cold start, memory per idle session (${SESSIONS})`,
  run: () =>
    timedResult('drivers', async () => {
      const notes: string[] = []
      const measured = new Map<DriverName, Measured>()
      for (const driver of DRIVERS) {
        const m = await measureDriver(driver, notes)
        if (m) measured.set(driver, m)
      }
      const labels = [...new Set([...measured.values()].flatMap((m) => [...m.keys()]))]
      const figures: Figure[] = labels.map((label) => {
        const rows: Partial<Record<DriverName, Row>> = {}
        let unit: string | undefined
        for (const [driver, m] of measured) {
          const r = m.get(label)
          if (!r) continue
          rows[driver] = r
          unit ??= r.unit
        }
        return unit ? { label, unit, rows } : { label, rows }
      })
      const table = printSideBySide(figures)
      const rows: Row[] = figures.flatMap((f) =>
        DRIVERS.flatMap((d) => {
          const r = f.rows[d]
          return r ? [{ ...r, name: `${d}: ${f.label}` }] : []
        }),
      )
      const targets: Target[] = []
      const pooled = figures.find((f) => f.label.startsWith('echo: cold start'))?.rows.gvisor
      if (pooled)
        targets.push({
          name: 'gVisor cold start with the pool (issue 10)',
          goal: 'median < 100 ms',
          value: pooled.summary.median,
          met: pooled.summary.median < 100,
        })
      return {
        config: {
          drivers: [...measured.keys()],
          turns: TURNS,
          warmup: WARMUP,
          pacedGapMs: PACED_GAP_MS,
          idleSessions: SESSIONS,
          gvisorPoolSize: GVISOR_POOL_SIZE,
          runsc: process.env.CAIRN_RUNSC ?? 'runsc',
          measured:
            'one server per driver (its default isolation). Warm turn: message POST -> run.completed, node:http keep-alive, paced, on one session per agent after 20 warm-up turns; floor GET /healthz. Cold start: POST /v1/sessions -> first message.delta of the first message, echo, each session kept (N grows to the idle count); gVisor waits untimed for a full pool before each; floor bwrap bash -c : or runsc do /bin/true. Idle memory: per sandbox cgroup, Pss/Rss sums of its processes (smaps_rollup) and the cgroup memory charge; server growth and MemAvailable drop divided by N (waiting pool slots and spare launchers are left out, and held at both ends)',
          sideBySide: table,
        },
        rows,
        targets,
        notes,
      }
    }),
}
