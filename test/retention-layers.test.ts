import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_AGENT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// Retention of every layer beside workspaces and snapshots (docs/retention.md): one server.
// Most of the file's time (10-30 s under load) is its two revision builds: a build log is only
// emptied for a revision that is no longer the agent's current one, so one must follow another.
let t: TestServer
let agentId = ''
let oldRevision = ''
let currentRevision = ''

const LAYER_FIELDS = [
  'artifactTtlMs',
  'buildLogTtlMs',
  'setupLogTtlMs',
  'memoryVersionTtlMs',
  'networkLogTtlMs',
  'sessionEventTtlMs',
  'turnEventTtlMs',
] as const
const TTL_FIELDS = ['endedSnapshotTtlMs', 'endedWorkspaceTtlMs', ...LAYER_FIELDS] as const
const every = (value: number | null) => Object.fromEntries(LAYER_FIELDS.map((f) => [f, value]))

const project = (variant: string) =>
  makeProject({
    'cairn.yaml':
      'name: layers\ncommand: bash agent.sh\nsetup: echo building\nsession:\n  setup: echo setting up\n',
    'agent.sh': `# ${variant}\n${SHELL_AGENT}`,
  })

const revisionOf = (body: { revision?: { id: string }; id?: string; currentRevisionId?: string }) =>
  body.revision?.id ?? body.currentRevisionId ?? ''

async function deployReady(variant: string): Promise<string> {
  const res = await t.api.deploy(await project(variant))
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  agentId = res.body.agent?.id ?? res.body.id
  const rev = revisionOf(res.body)
  let status = ''
  for (let i = 0; i < 600 && status !== 'READY'; i++) {
    status = (await t.api.call('GET', `/v1/agents/${agentId}/revisions/${rev}/logs`)).body.status
    if (status !== 'READY') await new Promise((r) => setTimeout(r, 100))
  }
  expect(status).toBe('READY')
  return rev
}

beforeAll(async () => {
  t = await startTestServer()
  oldRevision = await deployReady('first')
  currentRevision = await deployReady('second')
  expect(oldRevision).not.toBe(currentRevision)
})

afterAll(async () => {
  await t?.close()
})

/** A session with one of each: setup log, network log, status and turn events, an artifact. */
async function populated(): Promise<{ sessionId: string; artifactId: string }> {
  const { id } = await t.api.createSession('layers', { network: { allow: ['example.org'] } })
  const turn = await t.api.send(
    id,
    'echo kept > a.txt; curl -s -o /dev/null -w "%{http_code}" http://example.com/; echo',
  )
  expect(turn.text).toContain('403')
  const artifact = await t.api.call('POST', `/v1/sessions/${id}/artifacts`, { path: 'a.txt' })
  expect(artifact.status, JSON.stringify(artifact.body)).toBe(201)
  return { sessionId: id, artifactId: artifact.body.id }
}

async function layersOf(sessionId: string, artifactId: string) {
  const get = async (route: string) => (await t.api.call('GET', route)).body
  return {
    artifact: (await get(`/v1/agents/${agentId}/artifacts`)).data.some(
      (a: { id: string }) => a.id === artifactId,
    ),
    oldBuildLog: (await get(`/v1/agents/${agentId}/revisions/${oldRevision}/logs`)).lines.length,
    currentBuildLog: (await get(`/v1/agents/${agentId}/revisions/${currentRevision}/logs`)).lines.length,
    setupLog: await get(`/v1/sessions/${sessionId}/setup/log`),
    setupStatus: (await get(`/v1/sessions/${sessionId}/setup`)).status,
    memory: await get(`/v1/agents/${agentId}/memory`),
    network: (await get(`/v1/sessions/${sessionId}/network`)).data.length,
    events: (await get(`/v1/sessions/${sessionId}/events`)).data.length,
    messages: (await get(`/v1/sessions/${sessionId}/messages`)).data.length,
  }
}

describe('retention on every layer', () => {
  it('keeps every layer with null, and deletes each after its TTL at the next pass', async () => {
    const { sessionId, artifactId } = await populated()
    for (const content of ['first memory', 'second memory'])
      expect((await t.api.call('PUT', `/v1/agents/${agentId}/memory`, { content })).status).toBe(200)

    const keep = await t.api.call('PUT', '/v1/retention', every(null))
    expect(keep.status, JSON.stringify(keep.body)).toBe(200)
    expect(keep.body).toMatchObject(every(null))
    const kept = await t.server.retention.apply()
    expect(kept.layers).toEqual({})
    const before = await layersOf(sessionId, artifactId)
    expect(before).toMatchObject({ artifact: true, setupStatus: 'succeeded' })
    expect(before.setupLog).toContain('setting up')
    expect(before.oldBuildLog).toBeGreaterThan(0)
    expect(before.network).toBeGreaterThan(0)
    expect(before.events).toBeGreaterThan(1)
    expect(before.memory.version).toBe(2)

    // A TTL of 0: everything already there is past it at the next pass.
    expect((await t.api.call('PUT', '/v1/retention', every(0))).status).toBe(200)
    const applied = await t.server.retention.apply()
    const after = await layersOf(sessionId, artifactId)
    expect(after).toMatchObject({
      artifact: false,
      oldBuildLog: 0,
      // The current revision's log, the setup's outcome, the current memory, the session's latest
      // status event and the transcript stay.
      currentBuildLog: before.currentBuildLog,
      setupLog: '',
      setupStatus: 'succeeded',
      memory: { version: 2, content: 'second memory' },
      network: 0,
      events: 1,
      messages: before.messages,
    })
    expect((await t.api.call('GET', `/v1/agents/${agentId}/artifacts/${artifactId}`)).status).toBe(404)
    for (const kind of [
      'artifact',
      'build_log',
      'setup_log',
      'memory_version',
      'network_log',
      'session_event',
      'turn_event',
    ])
      expect(applied.layers[kind]?.bytesFreed, kind).toBeGreaterThan(0)
    expect(applied.layers.memory_version?.deleted).toBe(1)
    expect(applied.layers.artifact?.bytesFreed).toBe('kept\n'.length)
    const usage = (await t.api.call('GET', '/v1/usage')).body.retention
    expect(usage.layers.artifact).toEqual({ deleted: 1, bytesFreed: 5 })
    expect(usage.bytesFreed).toBeGreaterThanOrEqual(
      Object.values(applied.layers as Record<string, { bytesFreed: number }>).reduce(
        (s, l) => s + l.bytesFreed,
        0,
      ),
    )
    // The session goes on.
    expect((await t.api.send(sessionId, 'cat a.txt')).text).toContain('kept')
    await t.api.call('PUT', '/v1/retention', { ...every(null), turnEventTtlMs: 86_400_000 })
  })

  it('refuses a TTL of any wrong type, never coerced, and leaves the policy as it was', async () => {
    const policy = (await t.api.call('GET', '/v1/retention')).body
    const wrong = fc.oneof(
      fc.boolean(),
      fc.string(),
      // NaN and the infinities would travel as JSON null (a valid "keep"): not wrong types on the wire.
      fc.double({ noNaN: true, noDefaultInfinity: true }).filter((n) => !Number.isInteger(n) || n < 0),
      fc.integer({ max: -1 }),
      fc.array(fc.integer(), { maxLength: 2 }),
      fc.dictionary(fc.string(), fc.integer(), { maxKeys: 2 }),
    )
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...TTL_FIELDS), wrong, async (field, value) => {
        const res = await t.api.call('PUT', '/v1/retention', { [field]: value })
        expect(res.status, `${field}: ${JSON.stringify(value)}`).toBe(400)
        expect(res.body.error.code).toBe('validation_failed')
        expect(res.body.error.message).toMatch(new RegExp(`^body/${field} must be`))
      }),
      { numRuns: 60 },
    )
    expect((await t.api.call('GET', '/v1/retention')).body).toEqual(policy)
  })

  it('no longer injects a secret past its expiry, and the pass deletes it', async () => {
    const soon = new Date(Date.now() + 1500).toISOString()
    const set = await t.api.call('PUT', `/v1/agents/${agentId}/secrets`, {
      secrets: { SHORT_LIVED: 'value-1234' },
      expiresAt: soon,
    })
    expect(set.status, JSON.stringify(set.body)).toBe(200)
    expect(set.body.data.find((s: { name: string }) => s.name === 'SHORT_LIVED').expiresAt).toBe(soon)
    const { id } = await t.api.createSession('layers')
    expect((await t.api.send(id, 'echo "length ${#SHORT_LIVED}"')).text).toContain('length 10')
    while (Date.now() <= Date.parse(soon)) await new Promise((r) => setTimeout(r, 100))
    // The warm sandbox was started with it: the next turn runs in a new one, without it.
    expect((await t.api.send(id, 'echo "length ${#SHORT_LIVED}"')).text).toContain('length 0')
    const applied = await t.server.retention.apply()
    expect(applied.layers.secret?.deleted).toBe(1)
    const listed = (await t.api.call('GET', `/v1/agents/${agentId}/secrets`)).body.data
    expect(listed.map((s: { name: string }) => s.name)).not.toContain('SHORT_LIVED')
    // An expiry that is not a future time is refused, and nothing is stored.
    for (const expiresAt of [new Date(Date.now() - 1000).toISOString(), 'tomorrow', 17]) {
      const res = await t.api.call('PUT', `/v1/agents/${agentId}/secrets`, {
        secrets: { OTHER: 'x' },
        expiresAt,
      })
      expect(res.status, JSON.stringify(expiresAt)).toBe(400)
      expect(res.body.error.code).toBe('validation_failed')
    }
    const names = (await t.api.call('GET', `/v1/agents/${agentId}/secrets`)).body.data
    expect(names.map((s: { name: string }) => s.name)).not.toContain('OTHER')
  })
})
