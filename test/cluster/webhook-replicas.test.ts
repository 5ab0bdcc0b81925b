import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { TestPostgres, testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'
import { WebhookReceiver } from '../helpers/webhook-receiver.js'

// Two API replicas on one PostgreSQL, both delivering webhooks from the one outbox: each attempt
// at each message is made by one of them (the claim), never by both.
const SESSIONS = 30

let postgres: TestPostgres
let receiver: WebhookReceiver
const replicas: TestServer[] = []

beforeAll(async () => {
  receiver = await new WebhookReceiver().listen()
  postgres = await TestPostgres.start()
  const database = await postgres.createDatabase()
  const webhooks = { webhookAllowCidrs: ['127.0.0.1/32'], webhookTiming: { pollMs: 20, retryBaseMs: 50 } }
  for (let i = 0; i < 2; i++) replicas.push(await startTestServer({ server: { database, ...webhooks } }))
}, 120_000)

afterAll(async () => {
  for (const r of replicas) await r.close().catch(() => undefined)
  await postgres?.stop()
  await receiver?.close()
})

// On a PostgreSQL of its own in either pass of the suite: run once (the SQLite pass).
describe.skipIf(testsRunOnPostgres())('webhooks from two replicas', () => {
  it('sends each attempt at each message once, whichever replica claims it', async () => {
    const api = new Api(replicas[0]?.url ?? '', replicas[0]?.key ?? '')
    const hook = await api.call('POST', '/v1/webhooks', {
      url: receiver.url,
      events: ['session.status_changed'],
    })
    expect(hook.status).toBe(201)
    // Every message is refused once, then accepted: two attempts each, each to be made once.
    const seen = new Set<string>()
    receiver.answer = (r) => {
      const id = r.headers['webhook-id'] ?? ''
      if (seen.has(id)) return 200
      seen.add(id)
      return 500
    }
    expect(
      (await api.deploy(await makeProject({ 'cairn.yaml': 'name: quiet\ncommand: cat\n' }))).status,
    ).toBe(201)
    for (let i = 0; i < SESSIONS; i++) await api.createSession('quiet')
    const attempts = await receiver.until((all) => {
      const byMessage = new Map<string, number>()
      for (const r of all)
        byMessage.set(r.headers['webhook-id'] ?? '', (byMessage.get(r.headers['webhook-id'] ?? '') ?? 0) + 1)
      return byMessage.size === SESSIONS && [...byMessage.values()].every((n) => n >= 2)
        ? byMessage
        : undefined
    }, 60_000)
    // Give a double sender time to show itself, then count again.
    await new Promise((resolve) => setTimeout(resolve, 500))
    expect(receiver.received.length).toBe(2 * SESSIONS)
    expect([...attempts.values()].every((n) => n === 2)).toBe(true)
  })
})
