import { type Bench, progress, timedResult } from './lib/bench.js'
import { NodeHttpClient } from './lib/client.js'
import type { Target } from './lib/results.js'
import { EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row, summarize } from './lib/stats.js'

const CONCURRENCY = [1, 10, 50, 100] as const
const WARMUP_MS = 1000
const MEASURE_MS = 5000
/** Throughput is sampled over windows of this length (turns completed in each, per second). */
const WINDOW_MS = 500

const MODES = [
  { label: 'default', extra: {} },
  { label: 'autoSnapshots: false', extra: { autoSnapshots: false } },
] as const

/**
 * Turns per second across N warm echo sessions driven at once: each of N clients sends its
 * session's next turn the moment the last one completed (a closed loop), over one keep-alive
 * node:http agent with a connection per session. Latency is message POST to `run.completed`.
 * Run with sessions as created by default (a snapshot after every turn) and with
 * `autoSnapshots: false`.
 */
export const throughput: Bench = {
  name: 'throughput',
  description: 'turns/s and latency across 1, 10, 50 and 100 concurrent warm echo sessions',
  run: () =>
    timedResult('throughput', async () => {
      // The per-key rate limit (1,000 requests/s by default) is an operator policy, not capacity.
      // So is the per-tenant cap on running sandboxes (64 by default).
      const server = await startBenchServer({
        server: {
          rateLimitPerSecond: 0,
          operatorLimits: { maxSandboxesPerTenant: Math.max(...CONCURRENCY) },
        },
      })
      const client = new NodeHttpClient(server.url, server.key, Math.max(...CONCURRENCY) + 4)
      try {
        await server.deploy(`${EXAMPLES}/echo`)
        const rows: Row[] = []
        const targets: Target[] = []
        const notes: string[] = []
        for (const mode of MODES) {
          for (const n of CONCURRENCY) {
            progress(
              `${mode.label}: warming ${n} sessions, then ${MEASURE_MS / 1000} s of turns from ${n} clients`,
            )
            const ids: string[] = []
            // One at a time (before 876f3e7, concurrent first turns of one agent raced in MemoryService.bind).
            for (let i = 0; i < n; i++) {
              const { id } = await server.createSession('echo', { keepWarmMs: 600_000, ...mode.extra })
              const t = await client.stream(`/v1/sessions/${id}/messages`, { prompt: 'warm' })
              if (t.terminal !== 'run.completed') throw new Error(`warm-up turn: ${t.status} ${t.terminal}`)
              ids.push(id)
            }
            const start = performance.now()
            const measureFrom = start + WARMUP_MS
            const deadline = measureFrom + MEASURE_MS
            const latencies: number[] = []
            const completions: number[] = []
            const problems: string[] = []
            await Promise.all(
              ids.map(async (id, k) => {
                for (let i = 0; performance.now() < deadline; i++) {
                  const sent = performance.now()
                  const t = await client.stream(`/v1/sessions/${id}/messages`, { prompt: `s${k} t${i}` })
                  const done = performance.now()
                  if (t.terminal !== 'run.completed' || t.text !== `s${k} t${i}\n`) {
                    problems.push(`${t.status} ${t.terminal} ${t.error ?? ''}`)
                    if (problems.length > 10) return
                    continue
                  }
                  if (sent >= measureFrom && done <= deadline) {
                    latencies.push(t.completedMs as number)
                    completions.push(done)
                  }
                }
              }),
            )
            if (problems.length > 0) throw new Error(`turns failed: ${problems.slice(0, 5).join('; ')}`)
            const windows = Array.from({ length: MEASURE_MS / WINDOW_MS }, () => 0)
            for (const at of completions) {
              const w = Math.floor((at - measureFrom) / WINDOW_MS)
              if (w >= 0 && w < windows.length) windows[w] = (windows[w] ?? 0) + 1
            }
            const perSecond = (completions.length * 1000) / MEASURE_MS
            const name = `${mode.label}, N=${n}`
            const rate = {
              ...row(
                `${name}: turns/s (per ${WINDOW_MS} ms window)`,
                windows.map((c) => (c * 1000) / WINDOW_MS),
              ),
              unit: 'turns/s',
            }
            rows.push(rate, row(`${name}: turn latency`, latencies))
            const lat = summarize(latencies)
            notes.push(
              `${name}: ${perSecond.toFixed(0)} turns/s over ${MEASURE_MS / 1000} s (${completions.length} turns), latency p50 ${lat.median.toFixed(2)} ms, p99 ${lat.p99.toFixed(2)} ms`,
            )
            if (n === 100)
              targets.push({
                name: `turns/s across 100 concurrent sessions, ${mode.label} (issue 9)`,
                goal: '>= 500 turns/s',
                value: perSecond,
                met: perSecond >= 500,
                unit: 'turns/s',
              })
            for (const id of ids) await server.deleteSession(id)
          }
        }
        return {
          config: {
            concurrency: CONCURRENCY,
            warmupMs: WARMUP_MS,
            measureMs: MEASURE_MS,
            windowMs: WINDOW_MS,
            modes: MODES.map((m) => m.label),
            client: 'node:http keep-alive, one agent, a connection per session',
            measured:
              'closed loop: each session gets its next turn when the last one completed; turns counted that were sent after the warm-up and completed before the end; latency: message POST to run.completed',
          },
          rows,
          targets,
          notes,
        }
      } finally {
        client.close()
        await server.close()
      }
    }),
}
