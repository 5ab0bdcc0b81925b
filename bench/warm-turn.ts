import { type Bench, progress, repeat } from './lib/bench.js'
import type { Client, StreamTiming } from './lib/client.js'
import { machineInfo } from './lib/machine.js'
import type { BenchResult, Target } from './lib/results.js'
import { EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row, summarize } from './lib/stats.js'
import {
  TURN_CASES as CASES,
  PACED_GAP_MS as GAP_MS,
  healthzSamples,
  pacedTurns,
  roundTrips,
  turnSender,
} from './lib/turns.js'

const TURNS = 200
const WARMUP = 20
const FLOOR_RUNS = 200

/**
 * Turns on one warm session per agent, POST /v1/sessions/{id}/messages to `run.completed`
 * received, after a warm-up:
 * - back to back, node:http and fetch (both keep-alive) alternating turn by turn: the next turn
 *   is sent the moment the last one completed, so work a turn leaves behind lands on the next;
 * - paced, node:http, with a think time between turns, as in a conversation.
 * The floor is GET /healthz with the same client: the HTTP round trip alone.
 */
export const warmTurn: Bench = {
  name: 'warm-turn',
  description: 'warm turn round trip, HTTP + SSE + sandbox (echo, notes)',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const server = await startBenchServer()
    try {
      const clients: Client[] = [server.http, server.fetch]
      const label = (c: Client) => (c === server.http ? 'node:http' : 'fetch')

      progress(`HTTP floor: GET /healthz x ${FLOOR_RUNS} per client`)
      const floors = new Map<Client, { name: string; median: number }>()
      const rows: Row[] = []
      for (const client of clients) {
        const r = row(`GET /healthz (${label(client)})`, await healthzSamples(client, FLOOR_RUNS))
        rows.push(r)
        floors.set(client, { name: `healthz ${label(client)}`, median: r.summary.median })
      }

      const targets: Target[] = []
      const notes: string[] = []
      const config: Record<string, unknown> = {
        turns: TURNS,
        warmup: WARMUP,
        pacedGapMs: GAP_MS,
        clients: clients.map((c) => c.kind),
        measured:
          'round trip: message POST issued -> run.completed event received (the reply is one message.delta just before it); server durationMs: from run.completed',
      }
      for (const c of CASES) {
        await server.deploy(`${EXAMPLES}/${c.name}`)
        const session = await server.createSession(c.name, { keepWarmMs: 10 * 60_000 })
        const problems: string[] = []
        const sender = turnSender(session.id, c, problems)
        const send = (client: Client) => sender.send(client)
        progress(`${c.name}: ${WARMUP} warm-up turns, ${TURNS} back to back per client, ${TURNS} paced`)
        for (let i = 0; i < WARMUP; i++) await send(clients[i % 2] as Client)
        const got = new Map<Client, StreamTiming[]>(clients.map((k) => [k, []]))
        const b2b = await repeat(TURNS, 60_000, async () => {
          for (const client of clients) got.get(client)?.push(await send(client))
        })
        const pacedRun = await pacedTurns(sender, server.http, TURNS, GAP_MS, 60_000)
        const paced = pacedRun.timings
        config[`${c.name}Truncated`] = b2b.truncated || pacedRun.truncated
        config[`${c.name}SessionTurns`] = sender.count
        if (problems.length > 0)
          throw new Error(`${c.name} turns failed:\n${problems.slice(0, 10).join('\n')}`)

        const http = got.get(server.http) as StreamTiming[]
        const pacedRow = row(
          `${c.name}: paced round trip (node:http)`,
          roundTrips(paced),
          floors.get(server.http),
        )
        const b2bRow = row(
          `${c.name}: back-to-back round trip (node:http)`,
          roundTrips(http),
          floors.get(server.http),
        )
        rows.push(
          pacedRow,
          row(
            `${c.name}: paced server durationMs`,
            paced.map((t) => t.serverDurationMs as number),
          ),
          b2bRow,
          row(
            `${c.name}: back-to-back round trip (fetch)`,
            roundTrips(got.get(server.fetch) as StreamTiming[]),
            floors.get(server.fetch),
          ),
          row(
            `${c.name}: back-to-back server durationMs`,
            clients.flatMap((k) => (got.get(k) as StreamTiming[]).map((t) => t.serverDurationMs as number)),
          ),
        )
        if (c.name === 'echo') {
          const goal = (name: string, r: Row, what: 'median' | 'p99', limit: number): Target => ({
            name,
            goal: `${what} < ${limit} ms`,
            value: r.summary[what],
            met: r.summary[what] < limit,
          })
          targets.push(
            goal('echo warm turn, paced (issue 2)', pacedRow, 'median', 5),
            goal('echo warm turn, back to back (issue 2)', b2bRow, 'median', 5),
            goal('echo warm turn, paced (issue 9)', pacedRow, 'median', 3),
            goal('echo warm turn p99, paced (issue 9)', pacedRow, 'p99', 10),
          )
        }
        // Drift: the session grows by one turn per turn; compare its first and last 50.
        const head = summarize(roundTrips(http.slice(0, 50))).median
        const tail = summarize(roundTrips(http.slice(-50))).median
        notes.push(
          `${c.name}: back-to-back node:http round trip, median of its first 50 turns ${head.toFixed(2)} ms, of its last 50 ${tail.toFixed(2)} ms (turns ${WARMUP + 1}-${WARMUP + 2 * TURNS} of one session)`,
        )
        await server.deleteSession(session.id)
      }
      return {
        bench: 'warm-turn',
        startedAt,
        durationMs: performance.now() - t0,
        machine: machineInfo(),
        config,
        rows,
        targets,
        notes,
      }
    } finally {
      await server.close()
    }
  },
}
