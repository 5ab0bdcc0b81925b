import { type Bench, concurrently, progress, repeat, timedResult } from './lib/bench.js'
import type { Target } from './lib/results.js'
import { type BenchServer, EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row, summarize } from './lib/stats.js'

/** Stored sessions (override: BENCH_SCALE_SESSIONS). */
const SESSIONS = Number(process.env.BENCH_SCALE_SESSIONS ?? 10_000)
/** Every tenth session is of `notes`, the rest of `echo`; one in a hundred is ended (`completed`). */
const NOTES_EVERY = 10
const END_EVERY = 100
const CREATE_CONCURRENCY = 8
const REQUESTS = 200
const RESTARTS = 5
/** 10,000 workspaces and their creation snapshots: 20,000 subvolumes, more than a 1 GiB pool holds. */
const POOL_BYTES = 4 * 1024 ** 3

/**
 * 10,000 stored sessions (created through the API, 8 at a time), then: server start-up with them
 * (startServer on the same data dir, to listening) against start-up with none, and the latency of
 * `GET /v1/sessions` (plain, `?agent=`, `?status=`, a page deep in the cursor) and of
 * `GET /v1/sessions/resolve?prefix=`, with 100 sessions and with 10,000.
 */
export const scale: Bench = {
  name: 'scale',
  description: 'server start-up and list/resolve latency with 10,000 stored sessions',
  run: () =>
    timedResult('scale', async () => {
      const options = { server: { poolImageSizeBytes: POOL_BYTES } }
      let server: BenchServer = await startBenchServer(options)
      const dataDir = server.dataDir
      const large = SESSIONS.toLocaleString('en-US')
      try {
        await server.deploy(`${EXAMPLES}/echo`)
        await server.deploy(`${EXAMPLES}/notes`)
        const ids: string[] = []
        let created = 0
        const createUpTo = async (total: number) => {
          const from = created
          const a = performance.now()
          await concurrently(total - from, CREATE_CONCURRENCY, async (k) => {
            const i = from + k
            const { id } = await server.createSession(i % NOTES_EVERY === 0 ? 'notes' : 'echo')
            ids[i] = id
            if (i % END_EVERY === 1) {
              const res = await server.http.json('POST', `/v1/sessions/${id}/end`)
              if (res.status !== 200) throw new Error(`end: ${res.status} ${JSON.stringify(res.body)}`)
            }
          })
          created = total
          return performance.now() - a
        }
        const restart = async () => {
          await server.close({ keepData: true })
          const a = performance.now()
          server = await startBenchServer({ ...options, dataDir })
          return performance.now() - a
        }

        const rows: Row[] = []
        const healthz: number[] = []
        for (let i = 0; i < REQUESTS + 20; i++) {
          const res = await server.http.json('GET', '/healthz')
          if (i >= 20) healthz.push(res.ms)
        }
        const floor = { name: 'GET /healthz', median: summarize(healthz).median }
        rows.push(row('GET /healthz (node:http)', healthz))

        const startups = async (label: string) => {
          const samples: number[] = []
          for (let i = 0; i < RESTARTS; i++) samples.push(await restart())
          return row(`server start-up, ${label} (startServer to listening)`, samples)
        }
        progress(`start-up with no sessions (${RESTARTS} restarts)`)
        const emptyStart = await startups('no sessions')
        rows.push(emptyStart)

        const lists = async (count: string) => {
          const routes: Array<[string, () => string]> = [
            ['GET /v1/sessions?limit=50', () => '/v1/sessions?limit=50'],
            ['GET /v1/sessions?agent=echo&limit=50', () => '/v1/sessions?agent=echo&limit=50'],
            ['GET /v1/sessions?agent=notes&limit=50', () => '/v1/sessions?agent=notes&limit=50'],
            ['GET /v1/sessions?status=idle&limit=50', () => '/v1/sessions?status=idle&limit=50'],
            ['GET /v1/sessions?status=completed&limit=50', () => '/v1/sessions?status=completed&limit=50'],
          ]
          // A page from the middle of the list: the cursor of the session halfway down.
          const middle = await server.http.json('GET', `/v1/sessions?limit=${Math.min(500, created / 2)}`)
          const cursor = middle.body.nextCursor as string | null
          if (cursor)
            routes.push([
              'GET /v1/sessions?limit=50&cursor= (a page deep in the list)',
              () => `/v1/sessions?limit=50&cursor=${encodeURIComponent(cursor)}`,
            ])
          let k = 0
          routes.push([
            'GET /v1/sessions/resolve?prefix= (12 characters)',
            () => `/v1/sessions/resolve?prefix=${(ids[(k++ * 7919) % created] as string).slice(0, 12)}`,
          ])
          const samples = new Map<string, number[]>(routes.map(([name]) => [name, []]))
          const problems: string[] = []
          for (let i = 0; i < 10; i++) for (const [, route] of routes) await server.http.json('GET', route())
          // Round-robin over the routes, so a noisy moment is shared by all.
          const { truncated } = await repeat(REQUESTS, 60_000, async () => {
            for (const [name, route] of routes) {
              const res = await server.http.json('GET', route())
              // An ID prefix can be ambiguous (409): still a full lookup, and rare at 12 characters.
              if (res.status !== 200 && res.status !== 409) problems.push(`${name}: ${res.status}`)
              else samples.get(name)?.push(res.ms)
            }
          })
          if (problems.length > 0) throw new Error(`list requests failed: ${problems.slice(0, 5).join(', ')}`)
          for (const [name, s] of samples) rows.push(row(`${count} sessions: ${name}`, s, floor))
          return truncated
        }

        progress('100 sessions: list and resolve latency')
        const createSmallMs = await createUpTo(100)
        await restart()
        const truncatedSmall = await lists('100')

        progress(
          `creating ${SESSIONS - created} more sessions through the API (${CREATE_CONCURRENCY} at a time)`,
        )
        const createMs = await createUpTo(SESSIONS)
        progress(`start-up with ${SESSIONS} sessions (${RESTARTS} restarts)`)
        const fullStart = await startups(`${large} sessions`)
        rows.push(fullStart)
        const ping = await server.http.json('GET', '/v1/sessions?limit=1')
        if (ping.status !== 200) throw new Error(`list after restart: ${ping.status}`)
        progress(`${large} sessions: list and resolve latency`)
        const truncatedLarge = await lists(large)

        const plain = rows.find((r) => r.name === `${large} sessions: GET /v1/sessions?limit=50`) as Row
        const targets: Target[] = [
          {
            name: 'server start-up with 10,000 sessions (issue 9)',
            goal: `median < start-up with none (${emptyStart.summary.median.toFixed(0)} ms) + 1 s`,
            value: fullStart.summary.median,
            met: fullStart.summary.median < emptyStart.summary.median + 1000,
          },
          {
            name: 'list latency with 10,000 sessions (issue 9)',
            goal: 'GET /v1/sessions?limit=50 reported; median < 10 ms',
            value: plain.summary.median,
            met: plain.summary.median < 10,
          },
        ]
        return {
          config: {
            sessions: SESSIONS,
            creation: `through the API (POST /v1/sessions, default options, ${CREATE_CONCURRENCY} concurrent); every ${NOTES_EVERY}th of notes, the rest of echo; every ${END_EVERY}th ended (status completed)`,
            createMs: createSmallMs + createMs,
            requests: REQUESTS,
            restarts: RESTARTS,
            poolImageBytes: POOL_BYTES,
            truncated: truncatedSmall || truncatedLarge,
            client: 'node:http keep-alive, one request at a time, routes round-robin',
          },
          rows,
          targets,
          notes: [
            `creating ${SESSIONS} sessions through the API took ${((createSmallMs + createMs) / 1000).toFixed(1)} s (${(SESSIONS / ((createSmallMs + createMs) / 1000)).toFixed(0)} sessions/s, ${CREATE_CONCURRENCY} concurrent)`,
            `start-up: ${emptyStart.summary.median.toFixed(0)} ms with no sessions, ${fullStart.summary.median.toFixed(0)} ms with ${SESSIONS}`,
          ],
        }
      } finally {
        await server.close()
      }
    }),
}
