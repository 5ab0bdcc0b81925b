import { Webhook } from 'standardwebhooks'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, REVIEWER_PROJECT } from './helpers/projects.js'
import { Api, startTestServer, type TestServer } from './helpers/server.js'
import { startServerProcess } from './helpers/server-process.js'
import { type Received, WebhookReceiver } from './helpers/webhook-receiver.js'

// One server for the file; the receiver is on loopback, which the operator allowed. The file takes
// about 30 s: the crash case starts two server processes, the second after a kill -9 of the first
// (its start then recovers the killed one's pool and sandboxes, ~10 s here).
let t: TestServer
let receiver: WebhookReceiver
const ECHO = {
  'cairn.yaml': 'name: hooked\ncommand: bash agent.sh\n',
  'agent.sh': 'while IFS= read -r line; do echo "got $line"; done\n',
}

beforeAll(async () => {
  receiver = await new WebhookReceiver().listen()
  // The housekeeping pass (which expires approval requests) every 500 ms.
  t = await startTestServer({
    reaperIntervalMs: 500,
    server: { webhookAllowCidrs: ['127.0.0.1/32'], webhookTiming: { pollMs: 100, retryBaseMs: 200 } },
  })
  for (const project of [ECHO, REVIEWER_PROJECT])
    expect((await t.api.deploy(await makeProject(project))).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
  await receiver?.close()
})

interface Message {
  type: string
  timestamp: string
  data: Record<string, unknown>
}

const parse = (r: Received) => JSON.parse(r.body) as Message
const ofSession = (sessionId: string) => (r: Received) => parse(r).data.sessionId === sessionId

async function register(api: Api, path: string, events: string[]) {
  const res = await api.call('POST', '/v1/webhooks', { url: `${receiver.url}${path}`, events })
  expect(res.status).toBe(201)
  return res.body as { id: string; secret: string }
}

describe('webhooks', () => {
  it('delivers signed lifecycle events that the standardwebhooks package verifies', async () => {
    const hook = await register(t.api, '/signed', [
      'session.status_changed',
      'turn.completed',
      'snapshot.taken',
      'setup.finished',
    ])
    expect(hook.id).toMatch(/^whk_/)
    expect(hook.secret).toMatch(/^whsec_/)
    const listed = await t.api.call('GET', `/v1/webhooks/${hook.id}`)
    expect(listed.body).not.toHaveProperty('secret')
    const { id: sessionId } = await t.api.createSession('hooked', { setup: { command: 'echo ready' } })
    expect((await t.api.send(sessionId, 'hello')).terminal?.type).toBe('run.completed')
    const mine = (r: Received) => r.path === '/hooks/signed' && ofSession(sessionId)(r)
    // Sent concurrently: each awaited, whatever the order they arrive in.
    await receiver.until((all) => {
      const types = new Set(all.filter(mine).map((r) => parse(r).type))
      const began = all.filter(mine).some((r) => parse(r).data.to === 'active')
      return began && ['turn.completed', 'setup.finished', 'snapshot.taken'].every((type) => types.has(type))
    })
    const verifier = new Webhook(hook.secret)
    const got = receiver.received.filter(mine)
    for (const r of got) expect(verifier.verify(r.body, r.headers)).toEqual(parse(r))
    // Another secret does not verify them.
    expect(() =>
      new Webhook(`whsec_${Buffer.alloc(32, 7).toString('base64')}`).verify(
        got[0]?.body ?? '',
        got[0]?.headers ?? {},
      ),
    ).toThrow()
    const changes = got.filter((r) => parse(r).type === 'session.status_changed').map((r) => parse(r).data)
    expect(changes).toContainEqual(
      expect.objectContaining({ from: 'idle', to: 'active', cause: expect.any(String) }),
    )
    const of = (type: string) => got.filter((r) => parse(r).type === type).map((r) => parse(r).data)
    expect(of('setup.finished')).toEqual([
      expect.objectContaining({ sessionId, status: 'succeeded', attempts: 1 }),
    ])
    expect(of('snapshot.taken')).toContainEqual(expect.objectContaining({ sessionId, reason: 'after_setup' }))
    const turn = got.find((r) => parse(r).type === 'turn.completed')
    expect(parse(turn as Received).data).toMatchObject({ sessionId, turn: 1, status: 'completed' })
    const log = await t.api.call('GET', `/v1/webhooks/${hook.id}/deliveries`)
    expect(log.status).toBe(200)
    const delivered = log.body.data as { id: string; status: string; attempts: { statusCode: number }[] }[]
    expect(delivered.length).toBeGreaterThanOrEqual(got.length)
    expect(delivered.every((d) => d.id.startsWith('whd_'))).toBe(true)
    expect(
      delivered.filter((d) => d.status === 'delivered').map((d) => d.attempts.map((a) => a.statusCode)),
    ).toContainEqual([200])
    await t.api.call('DELETE', `/v1/webhooks/${hook.id}`)
  })

  it('retries a delivery the receiver answered 500, with the same webhook-id, and logs both attempts', async () => {
    const hook = await register(t.api, '/flaky', ['turn.completed'])
    const refused = new Set<string>()
    receiver.answer = (r) => {
      if (r.path !== '/hooks/flaky') return 200
      const id = r.headers['webhook-id'] ?? ''
      if (refused.has(id)) return 200
      refused.add(id)
      return 500
    }
    const { id: sessionId } = await t.api.createSession('hooked')
    await t.api.send(sessionId, 'again')
    const tries = await receiver.until((all) => {
      const mine = all.filter((r) => r.path === '/hooks/flaky' && ofSession(sessionId)(r))
      return mine.length >= 2 ? mine : undefined
    })
    expect(tries[0]?.headers['webhook-id']).toBe(tries[1]?.headers['webhook-id'])
    const log = await waitFor(async () => {
      const res = await t.api.call('GET', `/v1/webhooks/${hook.id}/deliveries`)
      const d = (res.body.data as { status: string }[])[0]
      return d?.status === 'delivered' ? d : undefined
    })
    expect(
      (log as unknown as { attempts: { statusCode: number }[] }).attempts.map((a) => a.statusCode),
    ).toEqual([500, 200])
    receiver.answer = () => 200
    await t.api.call('DELETE', `/v1/webhooks/${hook.id}`)
  })

  it('sends approval.requested, approval.answered and approval.expired, signed, with the request', async () => {
    const hook = await register(t.api, '/review', [
      'approval.requested',
      'approval.answered',
      'approval.expired',
    ])
    const verifier = new Webhook(hook.secret)
    const signed = async (sessionId: string, type: string) => {
      const r = await receiver.until((all) =>
        all.find((r) => r.path === '/hooks/review' && ofSession(sessionId)(r) && parse(r).type === type),
      )
      return verifier.verify(r.body, r.headers) as Message
    }
    const { id: sessionId } = await t.api.createSession('reviewed')
    const run = await t.api.send(sessionId, 'ask first')
    const asked = run.events.find((e) => e.type === 'approval.requested')
    const approvalId = asked?.type === 'approval.requested' ? asked.approvalId : ''
    expect(approvalId).toMatch(/^apr_/)
    const requested = await signed(sessionId, 'approval.requested')
    const stored = (await t.api.call('GET', `/v1/sessions/${sessionId}/approvals/${approvalId}`)).body
    expect(requested.data).toEqual({
      approvalId,
      sessionId,
      agentId: expect.stringMatching(/^agt_/),
      turnId: stored.turnId,
      status: 'pending',
      summary: 'delete build/',
      action: { run: 'rm -rf build' },
      snapshotId: stored.snapshotId,
      requestedAt: stored.requestedAt,
      expiresAt: null,
    })
    expect(stored.snapshotId).toMatch(/^snap_/)
    const answered = await t.api.call('POST', `/v1/sessions/${sessionId}/approvals/${approvalId}/answer`, {
      decision: 'deny',
      note: 'not on a Friday',
    })
    expect(answered.status).toBe(200)
    const answer = await signed(sessionId, 'approval.answered')
    expect(answer.data).toMatchObject({ approvalId, sessionId, status: 'denied', note: 'not on a Friday' })
    expect(answer.timestamp).toBe(answered.body.answeredAt)
    // Nobody reads the second session: the housekeeping pass expires its request, and says so.
    const { id: lapsed } = await t.api.createSession('reviewed', { policy: { approvalTimeoutMs: 1000 } })
    await t.api.send(lapsed, 'ask second')
    const expired = await signed(lapsed, 'approval.expired')
    expect(expired.data).toMatchObject({ sessionId: lapsed, status: 'expired', note: null, answeredAt: null })
    expect(expired.timestamp).toBe(expired.data.expiresAt)
    // Each event once per request, however often the session is read after.
    await t.api.call('GET', `/v1/sessions/${lapsed}/approvals`)
    const types = receiver.received
      .filter((r) => r.path === '/hooks/review')
      .map((r) => `${parse(r).data.sessionId} ${parse(r).type}`)
      .sort()
    expect(types).toEqual(
      [
        `${sessionId} approval.requested`,
        `${sessionId} approval.answered`,
        `${lapsed} approval.requested`,
        `${lapsed} approval.expired`,
      ].sort(),
    )
    await t.api.call('DELETE', `/v1/webhooks/${hook.id}`)
  })

  it("keeps each tenant's endpoints and deliveries its own", async () => {
    const a = await register(t.api, '/a', ['turn.completed'])
    const other = await t.api.call('POST', '/v1/keys', { tenant: 'hooks-b', role: 'admin' })
    const b = new Api(t.url, other.body.key)
    expect((await b.call('GET', '/v1/webhooks')).body.data).toEqual([])
    for (const [method, route] of [
      ['GET', `/v1/webhooks/${a.id}`],
      ['PATCH', `/v1/webhooks/${a.id}`],
      ['DELETE', `/v1/webhooks/${a.id}`],
      ['GET', `/v1/webhooks/${a.id}/deliveries`],
    ] as const) {
      const res = await b.call(method, route, method === 'PATCH' ? { enabled: false } : undefined)
      expect(res.status, `${method} ${route}`).toBe(404)
      expect(res.body.error.code).toBe('webhook_not_found')
    }
    expect((await t.api.call('GET', `/v1/webhooks/${a.id}`)).body.enabled).toBe(true)
    // Tenant B's turn goes to B's endpoint only.
    await register(b, '/b', ['turn.completed'])
    expect((await b.deploy(await makeProject(ECHO))).status).toBe(201)
    const { id: sessionB } = await b.createSession('hooked')
    await b.send(sessionB, 'from b')
    await receiver.until((all) => all.some((r) => r.path === '/hooks/b' && ofSession(sessionB)(r)))
    const { id: sessionA } = await t.api.createSession('hooked')
    await t.api.send(sessionA, 'from a')
    await receiver.until((all) => all.some((r) => r.path === '/hooks/a' && ofSession(sessionA)(r)))
    expect(receiver.received.filter((r) => r.path === '/hooks/a' && ofSession(sessionB)(r))).toEqual([])
    expect(receiver.received.filter((r) => r.path === '/hooks/b' && ofSession(sessionA)(r))).toEqual([])
  })

  it('refuses bad input with typed errors and keeps nothing of it', async () => {
    const before = (await t.api.call('GET', '/v1/webhooks')).body.data.length
    const bad: [unknown, string][] = [
      [{ url: 'ftp://127.0.0.1/x', events: ['turn.completed'] }, 'validation_failed'],
      [{ url: 'not a url', events: ['turn.completed'] }, 'validation_failed'],
      [{ url: 'http://user:pw@127.0.0.1/', events: ['turn.completed'] }, 'validation_failed'],
      [{ url: receiver.url, events: ['turn.exploded'] }, 'validation_failed'],
      [{ url: receiver.url, events: [] }, 'validation_failed'],
      [{ url: receiver.url }, 'validation_failed'],
      [{ url: receiver.url, events: ['turn.completed'], secret: 'mine' }, 'validation_failed'],
      ['{"url":', 'invalid_json'],
    ]
    for (const [body, code] of bad) {
      const res = await t.api.call('POST', '/v1/webhooks', body)
      expect(res.status, JSON.stringify(body)).toBe(400)
      expect(res.body.error.code, JSON.stringify(body)).toBe(code)
    }
    expect((await t.api.call('GET', '/v1/webhooks')).body.data.length).toBe(before)
    const hook = await register(t.api, '/bad', ['turn.completed'])
    expect((await t.api.call('PATCH', `/v1/webhooks/${hook.id}`, {})).body.error.code).toBe(
      'validation_failed',
    )
    const badUrl = await t.api.call('PATCH', `/v1/webhooks/${hook.id}`, { url: 'gopher://x' })
    expect(badUrl.body.error.code).toBe('validation_failed')
    expect((await t.api.call('GET', `/v1/webhooks/${hook.id}`)).body.url).toBe(`${receiver.url}/bad`)
    const missing = await t.api.call('GET', '/v1/webhooks/whk_00000000000000000000/deliveries')
    expect([missing.status, missing.body.error.code]).toEqual([404, 'webhook_not_found'])
    const reader = await t.api.call('POST', '/v1/keys', { role: 'read' })
    const read = new Api(t.url, reader.body.key)
    expect((await read.call('GET', `/v1/webhooks/${hook.id}`)).status).toBe(200)
    expect((await read.call('DELETE', `/v1/webhooks/${hook.id}`)).status).toBe(403)
    expect((await t.api.call('DELETE', `/v1/webhooks/${hook.id}`)).status).toBe(200)
    expect((await t.api.call('GET', `/v1/webhooks/${hook.id}`)).status).toBe(404)
  })
})

describe('a webhook delivery across a crash', () => {
  it('is sent by the next server when the one that recorded the event was killed before sending it', async () => {
    const allowed = { webhookAllowCidrs: ['127.0.0.1/32'] }
    // The first server never looks at its outbox: what it recorded, only the database holds.
    const first = await startServerProcess({ ...allowed, webhookTiming: { pollMs: 3_600_000 } })
    let second: Awaited<ReturnType<typeof startServerProcess>> | undefined
    try {
      const api = new Api(first.url, first.key)
      const hook = await register(api, '/crash', ['session.status_changed'])
      expect((await api.deploy(await makeProject(ECHO))).status).toBe(201)
      const { id: sessionId } = await api.createSession('hooked')
      first.child.kill('SIGKILL')
      await new Promise((resolve) => first.child.once('close', resolve))
      second = await startServerProcess(
        { ...allowed, webhookTiming: { pollMs: 100 } },
        undefined,
        first.dataDir,
      )
      const created = await receiver.until((all) =>
        all.find(
          (r) => r.path === '/hooks/crash' && ofSession(sessionId)(r) && parse(r).data.cause === 'created',
        ),
      )
      expect(new Webhook(hook.secret).verify(created.body, created.headers)).toMatchObject({
        type: 'session.status_changed',
        data: { sessionId, to: 'idle', cause: 'created' },
      })
    } finally {
      await (second ?? first).stop()
    }
  })
})

async function waitFor<T>(check: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const found = await check()
    if (found !== undefined) return found
    if (Date.now() > deadline) throw new Error('timed out waiting')
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}
