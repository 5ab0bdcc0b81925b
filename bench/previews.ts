import { rm } from 'node:fs/promises'
import { type Bench, progress, repeat, timedResult } from './lib/bench.js'
import { NodeHttpClient } from './lib/client.js'
import type { BenchResult } from './lib/results.js'
import { makeProject, SHELL_AGENT, startBenchServer } from './lib/server.js'
import { row } from './lib/stats.js'
import { healthzSamples } from './lib/turns.js'

const RUNS = 200
const FIRST_RUNS = 10
const START_SERVER = [
  'mkdir -p site && echo hello > site/hello.txt',
  '(nohup python3 -m http.server 8000 --bind 127.0.0.1 --directory site >/dev/null 2>&1 &)',
  `for i in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1', 8000))" 2>/dev/null && break; sleep 0.05; done`,
].join(' && ')

/**
 * A preview: GET of a small file from `python3 -m http.server` inside a session's sandbox through
 * the preview listener (`Host: 8000-ses-<id>.localhost`), with the API key (node:http keep-alive). The first request of a
 * sandbox also starts its port relay; later ones reuse it (one unix connection each). The floor is
 * GET /healthz with the same client.
 */
export const previews: Bench = {
  name: 'previews',
  description: 'HTTP through the preview route to a service inside the sandbox (first and warm)',
  run(): Promise<BenchResult> {
    return timedResult('previews', async () => {
      const server = await startBenchServer()
      const dir = await makeProject('preview', 2, SHELL_AGENT)
      const previewClient = new NodeHttpClient(`http://127.0.0.1:${server.server.previewPort}`, server.key)
      const preview = (id: string) =>
        previewClient.json('GET', '/hello.txt', undefined, {
          host: `8000-${id.replace('_', '-')}.${server.server.previewDomain}`,
        })
      try {
        await server.deploy(dir)
        const healthz = await healthzSamples(server.http, RUNS)
        const floor = { name: 'GET /healthz', median: row('', healthz).summary.median }

        progress(`${FIRST_RUNS} sandboxes: the first preview request (port relay start)`)
        const first: number[] = []
        let warmSession = ''
        await repeat(FIRST_RUNS, 120_000, async (i) => {
          const { id } = await server.createSession('preview', { keepWarmMs: 600_000 })
          const started = await server.http.stream(`/v1/sessions/${id}/messages`, { prompt: START_SERVER })
          if (!started.text.includes('[exit 0]'))
            throw new Error(`could not start the server: ${started.text}`)
          const res = await preview(id)
          if (res.status !== 200) throw new Error(`first preview answered ${res.status}`)
          first.push(res.ms)
          if (i === 0) warmSession = id
          else await server.deleteSession(id)
        })

        progress(`${RUNS} warm preview requests`)
        for (let i = 0; i < 20; i++) await preview(warmSession)
        const warm: number[] = []
        await repeat(RUNS, 60_000, async () => {
          const res = await preview(warmSession)
          if (res.status !== 200) throw new Error(`preview answered ${res.status}`)
          warm.push(res.ms)
        })
        return {
          config: { runs: RUNS, firstRuns: FIRST_RUNS, client: server.http.kind },
          rows: [
            row('GET /healthz', healthz),
            row('first preview GET (starts the relay)', first, floor),
            row('warm preview GET', warm, floor),
          ],
          targets: [],
          notes: [
            'python3 -m http.server answers each request itself in about 1 ms; the relay adds a unix connection and a thread per request',
          ],
        }
      } finally {
        previewClient.close()
        await server.close()
        await rm(dir, { recursive: true, force: true })
      }
    })
  },
}
