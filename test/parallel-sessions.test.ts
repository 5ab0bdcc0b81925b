/**
 * The hosted docs' "Run 100 sessions in parallel" (hosted-docs-sessions.txt), as written, on a server
 * whose tenant may run 16 sandboxes at once: the messages over the cap wait for a sandbox (idle warm
 * ones are stopped, least recently used first; busy ones end their turns) instead of being refused.
 */
import Cairn from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

const SANDBOXES_PER_TENANT = 16

let t: TestServer

beforeAll(async () => {
  t = await startTestServer({ server: { operatorLimits: { maxSandboxesPerTenant: SANDBOXES_PER_TENANT } } })
  expect((await t.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
}, 120_000)

afterAll(async () => {
  await t?.close()
})

describe('the hosted docs: many sessions in parallel', () => {
  it('100 sessions created and run at once all answer, 16 sandboxes at a time', async () => {
    const client = new Cairn({ apiKey: t.key, baseUrl: t.url })
    // Run 100 sessions in parallel
    const sessions = await Promise.all(Array.from({ length: 100 }, () => client.createSession('echo')))
    // Each has its own microVM and /workspace
    const results = await Promise.all(sessions.map((s) => s.run('Process data')))
    expect(results.map((r) => r.text)).toEqual(results.map(() => 'Process data\n'))
    const infos = await Promise.all(sessions.map((s) => t.api.call('GET', `/v1/sessions/${s.id}`)))
    expect(infos.map((info) => info.body.turnCount)).toEqual(infos.map(() => 1))
  }, 300_000)
})
