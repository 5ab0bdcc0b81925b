import { TestPostgres } from '../test/helpers/postgres.js'
import { type Bench, progress, repeat } from './lib/bench.js'
import type { StreamTiming } from './lib/client.js'
import { machineInfo } from './lib/machine.js'
import type { BenchResult } from './lib/results.js'
import { type BenchServer, EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row } from './lib/stats.js'
import { healthzSamples, roundTrips, TURN_CASES, turnSender } from './lib/turns.js'

const TURNS = 200
const WARMUP = 20
const COLD_RUNS = 30
const LISTED_SESSIONS = 1000
const LIST_RUNS = 200
const FLOOR_RUNS = 200
const DATABASES = ['sqlite', 'postgres'] as const

/**
 * The control plane on SQLite (cairn.db in the data dir) and on PostgreSQL (a local cluster of its
 * own, started by the bench as the tests start theirs), side by side, each beside the HTTP floor of
 * its server: a warm echo turn (message POST to run.completed, back to back), a cold start (new
 * session, then its first message to run.completed) and GET /v1/sessions?limit=50 with 1,000
 * sessions stored.
 */
export const databases: Bench = {
  name: 'databases',
  description: 'warm turn, cold start and list latency on SQLite vs PostgreSQL (~2 min)',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const postgres = await TestPostgres.start()
    const rows: Row[] = []
    const config: Record<string, unknown> = {
      turns: TURNS,
      warmup: WARMUP,
      coldRuns: COLD_RUNS,
      listedSessions: LISTED_SESSIONS,
      listRuns: LIST_RUNS,
      client: 'node:http keep-alive',
      postgres: 'local cluster (initdb, fsync off as in the tests), loopback TCP',
    }
    const echo = TURN_CASES.find((c) => c.name === 'echo')
    if (!echo) throw new Error('no echo turn case')
    try {
      for (const database of DATABASES) {
        const server: BenchServer = await startBenchServer({
          server: database === 'postgres' ? { database: await postgres.createDatabase() } : {},
        })
        try {
          progress(`${database}: HTTP floor, ${TURNS} warm turns, ${COLD_RUNS} cold starts, list`)
          const floorRow = row(`${database}: GET /healthz`, await healthzSamples(server.http, FLOOR_RUNS))
          const floor = { name: `healthz (${database})`, median: floorRow.summary.median }
          rows.push(floorRow)
          await server.deploy(`${EXAMPLES}/echo`)

          const session = await server.createSession('echo', { keepWarmMs: 10 * 60_000 })
          const problems: string[] = []
          const sender = turnSender(session.id, echo, problems)
          for (let i = 0; i < WARMUP; i++) await sender.send(server.http)
          const warm: StreamTiming[] = []
          await repeat(TURNS, 60_000, async () => {
            warm.push(await sender.send(server.http))
          })
          if (problems.length > 0) throw new Error(`${database} warm turns failed: ${problems[0]}`)
          rows.push(row(`${database}: warm turn (echo)`, roundTrips(warm), floor))

          const cold: number[] = []
          const made: string[] = []
          await repeat(COLD_RUNS, 90_000, async () => {
            const began = performance.now()
            const { id } = await server.createSession('echo', { keepWarmMs: 0 })
            made.push(id)
            const first = await server.http.stream(`/v1/sessions/${id}/messages`, { prompt: 'ping 0' })
            if (first.terminal !== 'run.completed') throw new Error(`${database} cold start: ${first.error}`)
            cold.push(performance.now() - began)
          })
          rows.push(row(`${database}: cold start (create + first turn, echo)`, cold, floor))
          for (const id of made) await server.deleteSession(id)

          for (let i = 0; i < LISTED_SESSIONS; i++) await server.createSession('echo')
          const list: number[] = []
          await repeat(LIST_RUNS, 60_000, async () => {
            const res = await server.http.json('GET', '/v1/sessions?limit=50')
            if (res.status !== 200) throw new Error(`${database} list: ${res.status}`)
            list.push(res.ms)
          })
          rows.push(row(`${database}: GET /v1/sessions?limit=50 (${LISTED_SESSIONS} stored)`, list, floor))
        } finally {
          await server.close()
        }
      }
    } finally {
      await postgres.stop()
    }
    const median = (name: string) => rows.find((r) => r.name.startsWith(name))?.summary.median ?? Number.NaN
    const notes = ['warm turn', 'cold start', 'GET /v1/sessions'].map(
      (what) =>
        `${what}: PostgreSQL ${median(`postgres: ${what}`).toFixed(2)} ms vs SQLite ${median(`sqlite: ${what}`).toFixed(2)} ms (x${(median(`postgres: ${what}`) / median(`sqlite: ${what}`)).toFixed(2)})`,
    )
    return {
      bench: 'databases',
      startedAt,
      durationMs: performance.now() - t0,
      machine: machineInfo(),
      config,
      rows,
      targets: [],
      notes,
    }
  },
}
