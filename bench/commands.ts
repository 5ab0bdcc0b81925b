import { rm } from 'node:fs/promises'
import { type Bench, progress, repeat, timedResult } from './lib/bench.js'
import type { BenchResult } from './lib/results.js'
import { makeProject, SHELL_AGENT, startBenchServer } from './lib/server.js'
import { row } from './lib/stats.js'
import { healthzSamples } from './lib/turns.js'

const RUNS = 100

/**
 * A command's round trip on a warm session: POST /v1/sessions/{id}/commands (`true`), then its
 * output stream (GET …/output) read to its `exit` event, which carries the exit status. The
 * command enters the running sandbox through the host helper (a python3 start, the sandbox's
 * namespaces and seccomp program); the floor is GET /healthz with the same client.
 */
export const commands: Bench = {
  name: 'commands',
  description: "A command's round trip (start → exit status) in a warm session's sandbox",
  run(): Promise<BenchResult> {
    return timedResult('commands', async () => {
      const server = await startBenchServer()
      const dir = await makeProject('commands', 2, SHELL_AGENT)
      try {
        await server.deploy(dir)
        const healthz = await healthzSamples(server.http, RUNS)
        const floor = { name: 'GET /healthz', median: row('', healthz).summary.median }
        const { id } = await server.createSession('commands', { keepWarmMs: 600_000 })
        const warm = await server.http.stream(`/v1/sessions/${id}/messages`, { prompt: 'true' })
        if (!warm.text.includes('[exit 0]')) throw new Error(`the session did not warm up: ${warm.text}`)
        progress(`${RUNS} commands (start → exit status)`)
        const starts: number[] = []
        const trips: number[] = []
        await repeat(RUNS, 120_000, async () => {
          const started = await server.http.json('POST', `/v1/sessions/${id}/commands`, { command: ['true'] })
          if (started.status !== 201) throw new Error(`start answered ${started.status}`)
          const commandId = (started.body as { id: string }).id
          const out = await server.http.json('GET', `/v1/sessions/${id}/commands/${commandId}/output`)
          if (!String(out.body).includes('"exitCode":0'))
            throw new Error(`no exit status: ${String(out.body)}`)
          starts.push(started.ms)
          trips.push(started.ms + out.ms)
        })
        return {
          config: { runs: RUNS, client: server.http.kind },
          rows: [
            row('GET /healthz', healthz),
            row('start a command (POST …/commands)', starts, floor),
            row('round trip: start → exit status', trips, floor),
          ],
          targets: [],
          notes: [
            'a start waits for the helper to exec the command inside the sandbox (python3 -I -S starts in ~15 ms here)',
          ],
        }
      } finally {
        await server.close()
        await rm(dir, { recursive: true, force: true })
      }
    })
  },
}
