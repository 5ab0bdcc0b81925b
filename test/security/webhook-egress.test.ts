import { mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'
import { WebhookReceiver } from '../helpers/webhook-receiver.js'

// The wall: a webhook reaches no address an agent's egress may not (loopback, private and
// link-local ranges, this host, the control plane) unless the operator allowed the range, judged
// when the endpoint is registered and again when each delivery connects (a name can resolve
// elsewhere later, an allowance can be withdrawn). Two starts of one server on one data dir.
let dataDir: string
let t: TestServer | undefined
let receiver: WebhookReceiver
const FAST = { webhookTiming: { pollMs: 100, retryBaseMs: 100 } }
const endpoints: { id: string; url: string }[] = []

beforeAll(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-webhook-wall-'))
  receiver = await new WebhookReceiver().listen()
})

afterAll(async () => {
  await t?.close()
  await receiver?.close()
  await rm(dataDir, { recursive: true, force: true })
})

describe('webhooks and the egress address guard', () => {
  it('under an allowance: registers loopback receivers, but never the control plane itself', async () => {
    t = await startTestServer({ dataDir, server: { ...FAST, webhookAllowCidrs: ['127.0.0.0/8', '::1/128'] } })
    const own = await t.api.call('POST', '/v1/webhooks', {
      url: `${t.url}/v1/sessions`,
      events: ['turn.completed'],
    })
    expect([own.status, own.body.error?.code]).toEqual([422, 'webhook_url_forbidden'])
    expect(own.body.error.message).toContain('control plane')
    const port = new URL(receiver.url).port
    for (const url of [receiver.url, `http://localhost:${port}/by-name`]) {
      const res = await t.api.call('POST', '/v1/webhooks', { url, events: ['session.status_changed'] })
      expect(res.status, url).toBe(201)
      endpoints.push({ id: res.body.id, url })
    }
    expect(
      (await t.api.deploy(await makeProject({ 'cairn.yaml': 'name: walled\ncommand: cat\n' }))).status,
    ).toBe(201)
    await t.close()
    t = undefined
  })

  it('without one: refuses every forbidden spelling at registration, and sends nothing to what was registered', async () => {
    t = await startTestServer({ dataDir, server: FAST })
    t.api = new Api(t.url, (await readFile(path.join(dataDir, 'admin.key'), 'utf8')).trim())
    const forbidden = [
      'http://127.0.0.1/x',
      'http://localhost/x',
      'http://[::1]/x',
      'http://2130706433/x',
      'http://[::ffff:127.0.0.1]/x',
      'http://10.1.2.3/x',
      'http://192.168.0.1/x',
      'http://169.254.169.254/latest/meta-data/',
      'http://100.64.0.1/x',
      'https://[fd00::1]/x',
      'http://0.0.0.0/x',
    ]
    for (const url of forbidden) {
      const res = await t.api.call('POST', '/v1/webhooks', { url, events: ['turn.completed'] })
      expect([res.status, res.body.error?.code], url).toEqual([422, 'webhook_url_forbidden'])
      expect(res.body.error.details.address, url).toBeTruthy()
    }
    expect((await t.api.call('GET', '/v1/webhooks')).body.data.length).toBe(endpoints.length)
    // An event now: each endpoint's delivery is refused at connection, and the receiver hears nothing.
    await t.api.createSession('walled')
    for (const endpoint of endpoints) {
      const attempt = await firstAttempt(t, endpoint.id)
      expect(attempt.statusCode, endpoint.url).toBeNull()
      expect(attempt.error, endpoint.url).toContain('webhook_url_forbidden')
    }
    expect(receiver.received).toEqual([])
  })
})

async function firstAttempt(
  server: TestServer,
  id: string,
): Promise<{ statusCode: number | null; error: string }> {
  const deadline = Date.now() + 20_000
  for (;;) {
    const res = await server.api.call('GET', `/v1/webhooks/${id}/deliveries`)
    const attempt = res.body.data?.[0]?.attempts?.[0]
    if (attempt) return attempt
    if (Date.now() > deadline) throw new Error(`no attempt for ${id}`)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}
