import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { EXAMPLES, startTestServer, type TestServer } from '../helpers/server.js'

const SESSIONS = Number(process.env.CAIRN_LOAD_SESSIONS ?? 200)
const TURNS = 10

let t: TestServer

beforeAll(async () => {
  // The rate limit and the per-tenant sandbox cap are an operator's policy, not capacity.
  t = await startTestServer({
    server: { rateLimitPerSecond: 0, operatorLimits: { maxSandboxesPerTenant: SESSIONS } },
  })
  expect((await t.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0
}

describe('load', () => {
  it(`${SESSIONS} sessions × ${TURNS} turns concurrently: no error, no lost transcript entry`, async () => {
    const latencies: number[] = []
    const errors: string[] = []
    const started = performance.now()
    const ids = await Promise.all(
      Array.from({ length: SESSIONS }, () => t.api.createSession('echo').then((s) => s.id)),
    )
    await Promise.all(
      ids.map(async (id, index) => {
        for (let turn = 1; turn <= TURNS; turn++) {
          const t0 = performance.now()
          const result = await t.api.send(id, `s${index} t${turn}`)
          latencies.push(performance.now() - t0)
          if (result.text !== `s${index} t${turn}\n`)
            errors.push(`${id} turn ${turn}: ${JSON.stringify(result.events)}`)
        }
      }),
    )
    const elapsedS = (performance.now() - started) / 1000
    expect(errors).toEqual([])
    for (const id of ids) {
      const transcript = await t.api.call('GET', `/v1/sessions/${id}/messages`)
      expect(transcript.body.data).toHaveLength(TURNS * 2)
    }
    latencies.sort((a, b) => a - b)
    const figures = {
      sessions: SESSIONS,
      turns: SESSIONS * TURNS,
      elapsedS: Number(elapsedS.toFixed(2)),
      turnsPerSecond: Math.round((SESSIONS * TURNS) / elapsedS),
      p50Ms: Number(percentile(latencies, 50).toFixed(1)),
      p99Ms: Number(percentile(latencies, 99).toFixed(1)),
    }
    console.log(`load: ${JSON.stringify(figures)}`)
  }, 600_000)
})
