/**
 * The workspace architecture guide (../shared/reference/workspace-architecture-guide.txt, one of the
 * two documents Cairn answers to), walked as a user reads it: each case quotes one of its claims on
 * provenance, retention or human review and checks what Cairn does against a real server. Where
 * the reference sits beside the repo (the project's machines), the quotes are checked to be the
 * guide's own words; a clean clone without it runs every other case.
 */
import { existsSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, REVIEWER_PROJECT, SHELL_AGENT } from './helpers/projects.js'
import { REPO_ROOT, startTestServer, type TestServer } from './helpers/server.js'

const GUIDE_PATH = path.resolve(REPO_ROOT, '../shared/reference/workspace-architecture-guide.txt')
const guide = existsSync(GUIDE_PATH) ? readFileSync(GUIDE_PATH, 'utf8') : undefined

/** The claims walked here, quoted (short) from the guide. */
const CLAIM = {
  manifest: 'Store an audit manifest with repo branch or SHA, base image, setup script version',
  manifestRest: 'workspace volume or snapshot ID, memory summary ID, last tests, open ports, and dirty files',
  everyLayer:
    'Apply a retention policy to every layer: source checkout, artifacts, logs, memory, telemetry, secrets, volumes, and snapshots.',
  separateTtls:
    'assign TTLs separately for volumes, snapshots, logs, generated artifacts, telemetry, and memory summaries',
  workflowState: 'run status, approvals, pending human review',
  snapshotsAt: 'after setup, before risky edits, before human review, and before handoff',
  reviewThenResume: 'Human review followed by later resume',
  reviewModel: 'Workspace snapshot, memory summary, audit manifest, and review checkpoint',
}

const GIT = 'git -c user.name=t -c user.email=t@example.com'
const GUIDED = {
  'cairn.yaml': 'name: guided\ncommand: bash agent.sh\nsession:\n  setup: echo prepared | tee prepared.txt\n',
  'agent.sh': SHELL_AGENT,
}
const waitForPort = (port: number) =>
  `for i in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1', ${port}))" 2>/dev/null && break; sleep 0.05; done`

let t: TestServer
/** How far the server's clock runs ahead of this process's (retention's TTLs are passed by it). */
let aheadMs = 0
let agentId = ''

beforeAll(async () => {
  t = await startTestServer({ server: { clock: { now: () => Date.now() + aheadMs } } })
  const guided = await t.api.deploy(await makeProject(GUIDED))
  expect(guided.status).toBe(201)
  agentId = guided.body.agent?.id ?? guided.body.id
  expect((await t.api.deploy(await makeProject(REVIEWER_PROJECT))).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

const get = async (route: string) => {
  const res = await t.api.call('GET', route)
  expect(res.status, `GET ${route}: ${JSON.stringify(res.body)}`).toBe(200)
  return res.body
}
const snapshotsOf = async (id: string) =>
  (await get(`/v1/sessions/${id}/snapshots`)).data as {
    id: string
    kind: string
    reason: string
    label: string | null
  }[]

describe('the guide, quoted', () => {
  it.skipIf(guide === undefined)('quotes the guide as it is written', () => {
    for (const quote of Object.values(CLAIM)) expect(guide, quote).toContain(quote)
  })
})

describe('the guide on provenance', () => {
  it(`"${CLAIM.manifest}, ${CLAIM.manifestRest}": each is a field of GET …/manifest, filled`, async () => {
    const { id } = await t.api.createSession('guided')
    const tests = { status: 'passed', passed: 3, failed: 0, command: 'make test' }
    const made = await t.api.send(
      id,
      `${GIT} init -q -b main && ${GIT} commit -q --allow-empty -m base && mkdir -p .cairn && echo '${JSON.stringify(tests)}' > .cairn/last-tests.json && echo draft > notes.txt && (nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &) && ${waitForPort(8000)} && git rev-parse HEAD`,
    )
    const sha = /[0-9a-f]{40}/.exec(made.text)?.[0]
    expect(sha, made.text).toBeTruthy()
    const memory = await t.api.call('PUT', `/v1/agents/${agentId}/memory`, { content: 'use make test' })
    expect(memory.status).toBe(200)
    const manifest = await get(`/v1/sessions/${id}/manifest`)
    expect(manifest.repo).toEqual({ branch: 'main', sha })
    expect(manifest.baseImage).toEqual(expect.any(String))
    expect(manifest.baseImage.length).toBeGreaterThan(0)
    expect(manifest.setupVersion).toMatch(/^sha256:[0-9a-f]{64}$/)
    const snapshots = await snapshotsOf(id)
    expect(snapshots.map((s) => s.id)).toContain(manifest.snapshotId)
    expect(manifest.snapshotId).toBe(manifest.snapshotIds.at(-1))
    expect(manifest.memoryVersion).toBe(memory.body.version)
    expect(manifest.lastTests).toMatchObject(tests)
    expect(manifest.openPorts).toContain(8000)
    expect(manifest.dirtyFiles.added).toEqual(expect.arrayContaining(['notes.txt', 'prepared.txt']))
  })
})

describe('the guide on human review', () => {
  it(`"${CLAIM.workflowState}": the session shows its pending request, and the list names it`, async () => {
    const { id } = await t.api.createSession('reviewed')
    const run = await t.api.send(id, 'ask to delete build/')
    const asked = run.events.find((e) => e.type === 'approval.requested')
    const approvalId = asked?.type === 'approval.requested' ? asked.approvalId : ''
    expect(approvalId).toMatch(/^apr_/)
    expect(await get(`/v1/sessions/${id}`)).toMatchObject({ status: 'idle', approvalId })
    expect((await get(`/v1/sessions/${id}/approvals`)).data).toEqual([
      expect.objectContaining({ id: approvalId, status: 'pending', summary: 'delete build/' }),
    ])
  })

  it(`"${CLAIM.snapshotsAt}": each is a snapshot with its reason`, async () => {
    const { id } = await t.api.createSession('guided')
    expect((await t.api.send(id, 'cat prepared.txt')).text).toContain('prepared')
    const risky = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, { label: 'before risky edits' })
    expect(risky.status).toBe(201)
    const handoff = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, { label: 'before handoff' })
    expect(handoff.status).toBe(201)
    const reviewed = await t.api.createSession('reviewed')
    await t.api.send(reviewed.id, 'ask for review')
    const request = (await get(`/v1/sessions/${reviewed.id}/approvals`)).data[0]
    const snapshots = [...(await snapshotsOf(id)), ...(await snapshotsOf(reviewed.id))]
    expect(snapshots).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ reason: 'after_setup' }),
        expect.objectContaining({ id: risky.body.id, kind: 'manual', label: 'before risky edits' }),
        expect.objectContaining({ id: handoff.body.id, kind: 'manual', label: 'before handoff' }),
        expect.objectContaining({ id: request.snapshotId, kind: 'manual', reason: 'review' }),
      ]),
    )
  })

  it(`"${CLAIM.reviewThenResume}": "${CLAIM.reviewModel}", and the answer reaches the agent started cold`, async () => {
    const { id } = await t.api.createSession('reviewed', { keepWarmMs: 0 })
    await t.api.send(id, 'ask before the release')
    const approvalId = (await get(`/v1/sessions/${id}`)).approvalId as string
    const request = await get(`/v1/sessions/${id}/approvals/${approvalId}`)
    // The review checkpoint holds what the agent wrote before it asked.
    const kept = await t.api.call(
      'GET',
      `/v1/sessions/${id}/files/content?path=review.txt&snapshot=${request.snapshotId}`,
    )
    expect(kept.status).toBe(200)
    expect(JSON.stringify(kept.body)).toContain('ask before the release')
    for (let i = 0; i < 200 && (await get(`/v1/sessions/${id}`)).warm; i++)
      await new Promise((resolve) => setTimeout(resolve, 50))
    expect((await get(`/v1/sessions/${id}`)).warm).toBe(false)
    const answered = await t.api.call('POST', `/v1/sessions/${id}/approvals/${approvalId}/answer`, {
      decision: 'approve',
      note: 'after lunch',
    })
    expect(answered.status).toBe(200)
    const answerTurn = await turnOf(id, 2)
    expect(answerTurn).toMatchObject({
      status: 'completed',
      response: `got ${approvalId} approve after lunch`,
    })
    expect(answerTurn.sandboxId).not.toBe((await turnOf(id, 1)).sandboxId)
    const manifest = await get(`/v1/sessions/${id}/manifest`)
    expect(manifest.snapshotIds).toContain(request.snapshotId)
    expect(manifest.snapshotId).toEqual(expect.stringMatching(/^snap_/))
    expect(manifest.memoryVersion).toEqual(expect.any(Number))
    expect((await get(`/v1/sessions/${id}/approvals/${approvalId}`)).deliveredTurnId).toBe(answerTurn.id)
  })
})

describe('the guide on retention', () => {
  it(`"${CLAIM.separateTtls}": each layer has a TTL of its own`, async () => {
    const fields = [
      'endedWorkspaceTtlMs',
      'endedSnapshotTtlMs',
      'buildLogTtlMs',
      'setupLogTtlMs',
      'networkLogTtlMs',
      'artifactTtlMs',
      'sessionEventTtlMs',
      'turnEventTtlMs',
      'memoryVersionTtlMs',
    ]
    const distinct = Object.fromEntries(fields.map((f, i) => [f, (i + 1) * 3_600_000]))
    expect((await t.api.call('PUT', '/v1/retention', distinct)).status).toBe(200)
    expect(await get('/v1/retention')).toMatchObject(distinct)
    expect((await t.api.call('PUT', '/v1/retention', nullTtls(fields))).status).toBe(200)
  })

  it(`"${CLAIM.everyLayer}": the pass applies each TTL to what is there`, async () => {
    // Everything of the layers is made first, then every TTL passes at once. Build logs (a
    // revision's, once another is current) need a second build: test/retention-layers.test.ts.
    const { id: ended } = await t.api.createSession('guided', { network: { allow: ['example.org'] } })
    const turn = await t.api.send(
      ended,
      'echo out > out.txt; curl -s -o /dev/null -w "%{http_code}" http://example.com/; echo',
    )
    expect(turn.text).toContain('403')
    expect((await t.api.call('POST', `/v1/sessions/${ended}/artifacts`, { path: 'out.txt' })).status).toBe(
      201,
    )
    for (const content of ['older', 'newer'])
      expect((await t.api.call('PUT', `/v1/agents/${agentId}/memory`, { content })).status).toBe(200)
    const expiresAt = new Date(Date.now() + 60_000).toISOString()
    const secret = await t.api.call('PUT', `/v1/agents/${agentId}/secrets`, {
      secrets: { SHORT_LIVED: 'x' },
      expiresAt,
    })
    expect(secret.status, JSON.stringify(secret.body)).toBe(200)
    const { id: kept } = await t.api.createSession('guided')
    await t.api.send(kept, 'echo kept > kept.txt')
    for (const id of [ended, kept])
      expect((await t.api.call('POST', `/v1/sessions/${id}/end`)).status).toBe(200)

    // Snapshots first (the workspace stays), then the workspace of the other session.
    const layers = [
      'artifactTtlMs',
      'buildLogTtlMs',
      'setupLogTtlMs',
      'memoryVersionTtlMs',
      'networkLogTtlMs',
      'sessionEventTtlMs',
      'turnEventTtlMs',
    ]
    const zero = { ...Object.fromEntries(layers.map((f) => [f, 0])), endedSnapshotTtlMs: 0 }
    expect((await t.api.call('PUT', '/v1/retention', zero)).status).toBe(200)
    aheadMs = 120_000
    const applied = await t.server.retention.apply()
    expect(applied.snapshots).toBeGreaterThan(0)
    for (const kind of [
      'artifact',
      'setup_log',
      'memory_version',
      'network_log',
      'session_event',
      'turn_event',
      'secret',
    ])
      expect(applied.layers[kind]?.deleted, kind).toBeGreaterThan(0)
    expect(await snapshotsOf(kept)).toEqual([])
    const secrets = (await get(`/v1/agents/${agentId}/secrets`)).data as { name: string }[]
    expect(secrets.map((s) => s.name)).not.toContain('SHORT_LIVED')
    expect((await get(`/v1/sessions/${kept}`)).status).toBe('completed')

    expect((await t.api.call('PUT', '/v1/retention', { endedWorkspaceTtlMs: 0 })).status).toBe(200)
    const volumes = await t.server.retention.apply()
    expect(volumes.workspaces).toBeGreaterThanOrEqual(2)
    for (const id of [ended, kept]) expect((await get(`/v1/sessions/${id}`)).status).toBe('deleted')
    aheadMs = 0
  })
})

function nullTtls(fields: string[]) {
  return Object.fromEntries(fields.map((f) => [f, null]))
}

/** The session's turn `seq` once it ended. */
async function turnOf(
  sessionId: string,
  seq: number,
): Promise<{ id: string; status: string; response: string; sandboxId: string }> {
  for (let i = 0; i < 400; i++) {
    const turns = (await get(`/v1/sessions/${sessionId}/turns`)).data as {
      id: string
      seq: number
      status: string
      response: string
      sandboxId: string
    }[]
    const turn = turns.find((x) => x.seq === seq)
    if (turn && turn.status !== 'running') return turn
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  throw new Error(`session ${sessionId} has no ended turn ${seq}`)
}
