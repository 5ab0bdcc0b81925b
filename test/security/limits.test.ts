import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { Api, EXAMPLES, packDir, startTestServer, type TestServer } from '../helpers/server.js'

/**
 * A hostile tenant asks for more than the operator allows: limits above the ceilings, more
 * sandboxes, manual snapshots and API keys than its share, more requests by spreading them over
 * many keys. Each is refused with a typed error; another tenant is not affected.
 */
const RATE = 40
const OPERATOR_LIMITS = {
  maxMemoryMiB: 1024,
  maxPids: 512,
  maxCpus: 1,
  maxTurnTimeoutMs: 60_000,
  maxSetupTimeoutMs: 30_000,
  maxSandboxesPerTenant: 2,
  // A message over the cap waits this long for a sandbox (the sleeper's turns take 6 s).
  sandboxWaitMs: 2000,
  maxBuildsPerTenant: 1,
  maxManualSnapshotsPerSession: 3,
  maxManualSnapshotsPerTenant: 5,
  maxKeysPerTenant: 4,
}

let t: TestServer
let other: Api

/** An agent that answers each line, and sleeps first when the line is `sleep`. */
const SLEEPER = {
  'cairn.yaml': 'name: sleeper\ncommand: python3 -u sleeper.py\n',
  'sleeper.py': [
    'import time',
    'while True:',
    '    line = input()',
    '    if line == "sleep":',
    '        time.sleep(6)',
    '    print("done " + line)',
  ].join('\n'),
}

beforeAll(async () => {
  t = await startTestServer({ server: { rateLimitPerSecond: RATE, operatorLimits: OPERATOR_LIMITS } })
  expect((await t.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
  expect((await t.api.deploy(await makeProject(SLEEPER))).status).toBe(201)
  const b = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b', role: 'admin' })
  expect(b.status).toBe(201)
  other = new Api(t.url, b.body.key)
  expect((await other.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
  expect((await other.deploy(await makeProject(SLEEPER))).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

async function deployWith(yaml: string) {
  return t.api.deploy(await makeProject({ 'cairn.yaml': `name: greedy\ncommand: cat\n${yaml}` }))
}

describe("limits above the operator's ceilings", () => {
  it.each([
    ['limits:\n  memoryMiB: 65536\n', 'limits.memoryMiB', 65536, 1024],
    ['limits:\n  pids: 65536\n', 'limits.pids', 65536, 512],
    ['limits:\n  cpus: 256\n', 'limits.cpus', 256, 1],
    ['limits:\n  turnTimeoutMs: 86400000\n', 'limits.turnTimeoutMs', 86_400_000, 60_000],
    [
      'session:\n  setup:\n    command: "true"\n    timeoutMs: 21600000\n',
      'session.setup.timeoutMs',
      21_600_000,
      30_000,
    ],
  ])(
    'refuses %j at deploy with limit_above_ceiling naming the limit, the value and the ceiling',
    async (yaml, limit, value, ceiling) => {
      const res = await deployWith(yaml)
      expect(res.status).toBe(400)
      expect(res.body.error.code).toBe('limit_above_ceiling')
      expect(res.body.error.details).toEqual({ limit, value, ceiling })
      expect(res.body.error.message).toContain(String(ceiling))
      // Nothing was recorded.
      expect((await t.api.call('GET', '/v1/agents/greedy')).status).toBe(404)
    },
  )

  it('accepts limits at the ceiling', async () => {
    const res = await deployWith('limits:\n  memoryMiB: 1024\n  pids: 512\n  cpus: 1\n')
    expect(res.status).toBe(201)
  })

  it("refuses a session's own setup timeout above the ceiling", async () => {
    const res = await t.api.call('POST', '/v1/sessions', {
      agent: 'echo',
      setup: { command: 'true', timeoutMs: 3_600_000 },
    })
    expect(res.status).toBe(400)
    expect(res.body.error.code).toBe('limit_above_ceiling')
    expect(res.body.error.details).toEqual({ limit: 'setup.timeoutMs', value: 3_600_000, ceiling: 30_000 })
  })

  it('shows the maxima at GET /v1/runtime', async () => {
    const res = await t.api.call('GET', '/v1/runtime')
    expect(res.status).toBe(200)
    expect(res.body.limits).toMatchObject({ ...OPERATOR_LIMITS, tenantRateLimitPerSecond: RATE })
  })
})

describe('manual snapshots per session and per tenant', () => {
  it('refuses the snapshot past either cap with snapshot_limit_reached; another tenant is not affected', async () => {
    const first = (await t.api.createSession('echo')).id
    for (let i = 0; i < 3; i++)
      expect((await t.api.call('POST', `/v1/sessions/${first}/snapshots`, {})).status).toBe(201)
    const overSession = await t.api.call('POST', `/v1/sessions/${first}/snapshots`, {})
    expect(overSession.status).toBe(409)
    expect(overSession.body.error.code).toBe('snapshot_limit_reached')
    expect(overSession.body.error.details).toEqual({
      limit: 'maxManualSnapshotsPerSession',
      value: 3,
      ceiling: 3,
    })
    // An import takes a manual snapshot first (its undo): it counts too.
    const archive = await packDir(await makeProject({ 'imported.txt': 'x\n' }))
    const importing = await t.api.call('PUT', `/v1/sessions/${first}/workspace`, archive)
    expect(importing.status).toBe(409)
    expect(importing.body.error.code).toBe('snapshot_limit_reached')
    const second = (await t.api.createSession('echo')).id
    for (let i = 0; i < 2; i++)
      expect((await t.api.call('POST', `/v1/sessions/${second}/snapshots`, {})).status).toBe(201)
    const overTenant = await t.api.call('POST', `/v1/sessions/${second}/snapshots`, {})
    expect(overTenant.status).toBe(409)
    expect(overTenant.body.error.details).toEqual({
      limit: 'maxManualSnapshotsPerTenant',
      value: 5,
      ceiling: 5,
    })
    const theirs = (await other.createSession('echo')).id
    expect((await other.call('POST', `/v1/sessions/${theirs}/snapshots`, {})).status).toBe(201)
  })

  it('counts snapshots being taken: requests at once on many sessions pass the tenant cap no more', async () => {
    const sessions = await Promise.all(Array.from({ length: 6 }, () => other.createSession('echo')))
    const results = await Promise.all(
      sessions.map((s) => other.call('POST', `/v1/sessions/${s.id}/snapshots`, {})),
    )
    // tenant-b keeps one already (test above): four more reach its cap of five.
    expect(results.filter((r) => r.status === 201).length).toBe(4)
    const refused = results.filter((r) => r.status === 409)
    expect(refused.map((r) => r.body.error.code)).toEqual([
      'snapshot_limit_reached',
      'snapshot_limit_reached',
    ])
  })
})

describe('agent sandboxes per tenant', () => {
  it('stops the least recently used idle sandbox of the tenant to start a new one', async () => {
    const ids = [] as string[]
    for (let i = 0; i < 3; i++) ids.push((await t.api.createSession('echo', { keepWarmMs: 600_000 })).id)
    const [a, b, c] = ids as [string, string, string]
    expect((await t.api.send(a, 'one')).terminal?.type).toBe('run.completed')
    expect((await t.api.send(b, 'two')).terminal?.type).toBe('run.completed')
    const warm = async (id: string) => (await t.api.call('GET', `/v1/sessions/${id}`)).body.warm
    expect([await warm(a), await warm(b)]).toEqual([true, true])
    expect((await t.api.send(c, 'three')).terminal?.type).toBe('run.completed')
    expect([await warm(a), await warm(b), await warm(c)]).toEqual([false, true, true])
    // The stopped one starts again (cold) and takes the place of the least recently used, b.
    const again = await t.api.send(a, 'again')
    expect(again.terminal?.type).toBe('run.completed')
    expect(again.events.find((e) => e.type === 'run.started')).toMatchObject({ coldStart: true })
    expect([await warm(a), await warm(b), await warm(c)]).toEqual([true, false, true])
    for (const id of ids) await t.api.call('DELETE', `/v1/sessions/${id}`)
  })

  it('answers sandbox_limit_reached (retryable) when every sandbox of the tenant ran a turn for the whole wait; another tenant starts; a cancel ends the wait', async () => {
    const busy = [
      (await t.api.createSession('sleeper')).id,
      (await t.api.createSession('sleeper')).id,
    ] as const
    const third = (await t.api.createSession('sleeper')).id
    const running = busy.map((id) => t.api.send(id, 'sleep'))
    for (const id of busy) {
      for (let i = 0; i < 200; i++) {
        if ((await t.api.call('GET', `/v1/sessions/${id}`)).body.status === 'active') break
        await new Promise((r) => setTimeout(r, 100))
      }
    }
    const refused = await t.api.send(third, 'hello')
    expect(refused.status).toBe(429)
    expect((refused.body as { error: { code: string; details: unknown } }).error).toMatchObject({
      code: 'sandbox_limit_reached',
      details: { limit: 'maxSandboxesPerTenant', value: 2, ceiling: 2 },
    })
    // The refusal left the session as it was: idle, no turn recorded.
    expect((await t.api.call('GET', `/v1/sessions/${third}`)).body).toMatchObject({
      status: 'idle',
      turnCount: 0,
    })
    const theirs = (await other.createSession('echo')).id
    expect((await other.send(theirs, 'unaffected')).terminal?.type).toBe('run.completed')
    // A cancel ends a message's wait for a sandbox: refused, saying so, and nothing ran.
    const waiting = t.api.send(third, 'cancelled before it ran')
    // { ok: true } once the cancel found the message (waiting: it holds the session's turn lock).
    let found = false
    for (let i = 0; i < 100 && !found; i++) {
      const cancel = await t.api.call('POST', `/v1/sessions/${third}/cancel`)
      expect(cancel.status).toBe(200)
      found = cancel.body.ok === true
      if (!found) await new Promise((r) => setTimeout(r, 20))
    }
    expect(found).toBe(true)
    const cancelled = await waiting
    expect(cancelled.status).toBe(429)
    expect((cancelled.body as { error: { message: string } }).error.message).toContain(
      'cancelled while it waited',
    )
    expect((await t.api.call('GET', `/v1/sessions/${third}`)).body).toMatchObject({ turnCount: 0 })
    for (const run of await Promise.all(running)) expect(run.terminal?.type).toBe('run.completed')
    expect((await t.api.send(third, 'now')).text).toBe('done now\n')
  })
})

describe('builds per tenant', () => {
  it('refuses a deploy that needs a build while the tenant runs its most builds (sandbox_limit_reached, nothing recorded); another tenant builds', async () => {
    const building = (name: string) =>
      makeProject({ 'cairn.yaml': `name: ${name}\ncommand: cat\nsetup: sleep 3\n` })
    const first = await t.api.deploy(await building('build-one'))
    expect(first.status).toBe(201)
    expect(first.body.revision.status).toBe('DEPLOYING')
    const second = await t.api.deploy(await building('build-two'))
    expect(second.status).toBe(429)
    expect(second.body.error).toMatchObject({
      code: 'sandbox_limit_reached',
      details: { limit: 'maxBuildsPerTenant', value: 1, ceiling: 1 },
    })
    expect((await t.api.call('GET', '/v1/agents/build-two')).status).toBe(404)
    expect((await other.deploy(await building('build-theirs'))).status).toBe(201)
    for (let i = 0; i < 100; i++) {
      const agent = await t.api.call('GET', '/v1/agents/build-one')
      if (agent.body.currentRevisionId) break
      await new Promise((r) => setTimeout(r, 200))
    }
    expect((await t.api.deploy(await building('build-two'))).status).toBe(201)
  })
})

describe('API keys per tenant and the rate of all its keys together', () => {
  it('refuses the key past the cap with key_limit_reached; revoking frees a place; another tenant is not affected', async () => {
    // The default tenant holds its first-start admin key already.
    const created: string[] = []
    for (;;) {
      const res = await t.api.call('POST', '/v1/keys', { name: `k${created.length}` })
      if (res.status !== 201) {
        expect(res.status).toBe(409)
        expect(res.body.error.code).toBe('key_limit_reached')
        expect(res.body.error.details).toEqual({ limit: 'maxKeysPerTenant', value: 4, ceiling: 4 })
        break
      }
      created.push(res.body.id)
      expect(created.length).toBeLessThan(10)
    }
    expect(created.length).toBe(3)
    // The install admin creating a key for tenant-b: tenant-b's count, not the caller's.
    expect((await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b' })).status).toBe(201)
    expect((await t.api.call('DELETE', `/v1/keys/${created[0]}`)).status).toBe(200)
    expect((await t.api.call('POST', '/v1/keys', { name: 'after revoke' })).status).toBe(201)
  })

  it("gives a tenant's many keys no more than the tenant's rate together", async () => {
    const keys: string[] = []
    for (let i = 0; i < 3; i++) {
      const res = await other.call('POST', '/v1/keys', { name: `spread${i}` })
      if (res.status === 201) keys.push(res.body.key)
    }
    keys.push(other.key)
    expect(keys.length).toBeGreaterThanOrEqual(3)
    await new Promise((r) => setTimeout(r, 2500)) // every bucket full again
    const started = performance.now()
    const answers = await Promise.all(
      Array.from({ length: 60 * keys.length }, (_, i) =>
        new Api(t.url, keys[i % keys.length] as string).call('GET', '/v1/agents'),
      ),
    )
    const seconds = (performance.now() - started) / 1000
    const ok = answers.filter((a) => a.status === 200).length
    const limited = answers.filter((a) => a.status === 429)
    // One tenant: a burst of 2 × RATE, then RATE per second, whatever the number of keys.
    expect(ok).toBeLessThanOrEqual(2 * RATE + Math.ceil(seconds * RATE) + 1)
    expect(limited.length).toBeGreaterThan(0)
    expect(limited[0]?.body.error.code).toBe('rate_limited')
    // The default tenant's key is not held back by tenant-b's spending.
    expect((await t.api.call('GET', '/v1/agents')).status).toBe(200)
  })
})
