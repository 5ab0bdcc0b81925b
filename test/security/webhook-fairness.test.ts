import net from 'node:net'
import { WEBHOOK_TENANT_SLOTS } from '@cairn/server'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'
import { WebhookReceiver } from '../helpers/webhook-receiver.js'

// One tenant's slow receivers must not hold back another tenant's webhooks. The deliverer once
// claimed the 8 due deliveries with the oldest next attempt, whatever their tenant, and waited for
// all 8 (each up to 10 s) before it claimed more; so tenant A with 16 endpoints that accept and
// never answer, and two events, put 32 ten-second attempts ahead of tenant B's delivery (B's
// arrived after 46 of A's connections, 51 s in), and as long as A kept making events, without
// bound. Now it sends in slots, at most WEBHOOK_TENANT_SLOTS of a tenant's at once, the free ones
// given round-robin to the tenants with deliveries due: B's is sent within a poll, while A holds
// its 4 slots, and the test takes seconds.
let t: TestServer
let receiver: WebhookReceiver
let tarpit: net.Server
let held = 0
const sockets: net.Socket[] = []
let ending = false

beforeAll(async () => {
  receiver = await new WebhookReceiver().listen()
  tarpit = net.createServer((socket) => {
    if (ending) return socket.destroy()
    held++
    sockets.push(socket)
  })
  await new Promise<void>((resolve) => tarpit.listen(0, '127.0.0.1', resolve))
  t = await startTestServer({
    server: { webhookAllowCidrs: ['127.0.0.1/32'], webhookTiming: { pollMs: 100, retryBaseMs: 60_000 } },
  })
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
})

afterAll(async () => {
  // The attempts held end at once, so the server's close does not wait out their timeouts.
  ending = true
  for (const socket of sockets) socket.destroy()
  await t?.close()
  await new Promise((resolve) => tarpit?.close(resolve))
  await receiver?.close()
})

describe('webhook deliveries across tenants', () => {
  it("one tenant's hanging receivers do not hold back another tenant's deliveries", async () => {
    const port = (tarpit.address() as net.AddressInfo).port
    for (let i = 0; i < 16; i++) {
      const hook = await t.api.call('POST', '/v1/webhooks', {
        url: `http://127.0.0.1:${port}/slow/${i}`,
        events: ['snapshot.taken'],
      })
      expect(hook.status, JSON.stringify(hook.body)).toBe(201)
    }
    const mine = (await t.api.createSession('shell')).id
    for (let i = 0; i < 2; i++)
      expect((await t.api.call('POST', `/v1/sessions/${mine}/snapshots`, {})).status).toBe(201)
    for (let i = 0; i < 200 && held === 0; i++) await new Promise((r) => setTimeout(r, 100))
    expect(held).toBeGreaterThan(0)
    const made = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b', role: 'admin' })
    const b = new Api(t.url, made.body.key)
    expect((await b.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
    const hook = await b.call('POST', '/v1/webhooks', {
      url: `${receiver.url}/b`,
      events: ['snapshot.taken'],
    })
    expect(hook.status).toBe(201)
    const theirs = (await b.createSession('shell')).id
    expect((await b.call('POST', `/v1/sessions/${theirs}/snapshots`, {})).status).toBe(201)
    await receiver.until((received) => (received.length > 0 ? true : undefined), 120_000)
    // B's delivery did not wait behind every one of A's first attempts.
    console.log(`[webhook-fairness] A connections when B arrived: ${held}`)
    expect(held).toBeLessThanOrEqual(WEBHOOK_TENANT_SLOTS)
  }, 150_000)
})
