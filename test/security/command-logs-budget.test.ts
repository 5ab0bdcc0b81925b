import { execFileSync } from 'node:child_process'
import path from 'node:path'
import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Db, openDatabase } from '../../packages/server/src/db/database.js'
import { TURNS_PURPOSE } from '../../packages/server/src/limits/storage-budget.js'
import { testDatabaseFor } from '../fixtures/test-database.mjs'
import { closeOwned } from '../helpers/pool-owners.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'

// Command output logs (docs/commands.md: 8 MiB per command, a session's last 16 ended commands
// kept) are written under the node's data dir, beside the database: bytes a tenant makes the
// server keep, so they count in its storage budget. Before 57b9ed6 they did not: 16 commands of
// one session kept 134,291,456 bytes of logs under a 40 MiB tenant quota (sessions have no cap,
// so a tenant filled the data disk at 128 MiB per session). Now the fifth command is refused.
// A turn's stream events (the turn_events table, in the database) count the same way: before,
// eight turns of the shell agent printing 7 MiB each kept 117 MB of events (the deltas, and the
// reply again in each terminal event) under the same 40 MiB quota.
const TENANT_MIB = 40
const MiB = 1024 * 1024
let t: TestServer
/** The last case closes the server itself (it asserts what the close leaves). */
let closed = false

beforeAll(async () => {
  t = await startTestServer({
    server: { workspaceQuotaMiB: 0, tenantQuotaMiB: TENANT_MIB, rateLimitPerSecond: 0 },
  })
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
})

afterAll(async () => {
  if (!closed) await closeOwned(t)
})

/** A tenant of its own (an admin key) with the shell agent deployed and one session of it. */
async function shellTenant(tenant: string): Promise<{ api: Api; session: string }> {
  const made = await t.api.call('POST', '/v1/keys', { tenant, role: 'admin' })
  const api = new Api(t.url, made.body.key)
  expect((await api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
  return { api, session: (await api.createSession('shell')).id }
}

const logBytes = () =>
  Number(
    execFileSync('du', ['-sb', path.join(t.dataDir, 'command-logs')], { encoding: 'utf8' }).split('\t')[0],
  )

describe('command output logs in the tenant storage budget', () => {
  it('keep no more than the tenant quota for a tenant', async () => {
    const session = (await t.api.createSession('shell')).id
    for (let i = 0; i < 16; i++) {
      const started = await t.api.call('POST', `/v1/sessions/${session}/commands`, {
        command: ['head', '-c', String(8 * MiB), '/dev/zero'],
      })
      if (started.status !== 201) break
      for (let n = 0; n < 200; n++) {
        const got = await t.api.call('GET', `/v1/sessions/${session}/commands/${started.body.id}`)
        if (got.body.status !== 'running') break
        await new Promise((r) => setTimeout(r, 50))
      }
    }
    expect(await logBytes()).toBeLessThanOrEqual(TENANT_MIB * MiB)
  })
})

describe("a turn's stream events in the tenant storage budget", () => {
  it('are reserved before they are written: past the quota the turn fails quota_exceeded', async () => {
    const { api, session } = await shellTenant('tenant-events')
    // A turn's reply is capped at 8 MiB (limit_exceeded): 7 MiB a turn, until one is refused.
    const ends: string[] = []
    for (let i = 0; i < 8 && !ends.includes('quota_exceeded'); i++) {
      const run = await api.send(session, `head -c ${7 * MiB} /dev/zero | tr '\\0' x | fold -w 65536`)
      ends.push(run.terminal?.type === 'run.failed' ? run.terminal.error.code : String(run.terminal?.type))
      if (run.terminal?.type === 'run.failed')
        expect((await api.call('GET', `/v1/sessions/${session}`)).body.statusCause).toBe('quota_exceeded')
    }
    const kept = await keptBytes(session)
    console.log(
      `[turn-events-budget] kept ${kept.events} bytes of events, ${kept.transcript} of transcript; the turns ended ${ends.join(', ')}`,
    )
    expect(ends.at(-1)).toBe('quota_exceeded')
    // A turn's end (the events held, and the terminal event repeating the reply) and its reply in
    // the transcript are reserved before they are written: the tenant's events and transcript
    // together stay within its quota. Before, the end was counted once written and the transcript
    // not at all: 7 MiB over the quota with three of these turns.
    expect(kept.events + kept.transcript).toBeLessThanOrEqual(TENANT_MIB * MiB)
  })
})

describe("a turn's prompt in the tenant storage budget", () => {
  // Before, a turn's prompt and an end under 64 KiB were counted once written: a tenant at its
  // quota still ran turns (each keeping its prompt, reply and events past the quota). Now they are
  // admitted before any sandbox work, refused 507 quota_exceeded when they do not fit.
  it('is admitted before the turn starts: a tenant without room for it is refused, nothing recorded', async () => {
    const { api, session } = await shellTenant('tenant-prompts')
    const run = async (command: string) => {
      const started = await api.call('POST', `/v1/sessions/${session}/commands`, {
        command: ['sh', '-c', command],
      })
      expect(started.status, JSON.stringify(started.body)).toBe(201)
      for (let n = 0; n < 200; n++) {
        const got = await api.call('GET', `/v1/sessions/${session}/commands/${started.body.id}`)
        if (got.body.status !== 'running') return
        await new Promise((r) => setTimeout(r, 50))
      }
    }
    const save = () => api.call('POST', `/v1/sessions/${session}/artifacts`, { path: 'fill.bin' })
    // A sparse file as large as the quota: its refusal names everything the tenant holds.
    await run(`truncate -s ${TENANT_MIB * MiB} fill.bin`)
    const measured = await save()
    expect(measured.status).toBe(507)
    const held = measured.body.error.details
    const heldBytes = [
      'poolBytes',
      'artifactBytes',
      'commandLogBytes',
      'turnEventBytes',
      'turnTextBytes',
      'reservedBytes',
    ]
      .map((figure) => Number(held[figure]))
      .reduce((a, b) => a + b, 0)
    // An artifact that leaves the tenant 2,000 bytes: less than any turn's prompt and end.
    await run(`truncate -s ${TENANT_MIB * MiB - heldBytes - 2000} fill.bin`)
    const filled = await save()
    expect(filled.status, JSON.stringify(filled.body)).toBe(201)
    const refused = await api.send(session, 'echo kept')
    expect(refused.status, JSON.stringify(refused.events)).toBe(507)
    expect(refused.body.error.code).toBe('quota_exceeded')
    expect(refused.body.error.message).toMatch(/turns \(their prompts and ends\)/)
    const after = (await api.call('GET', `/v1/sessions/${session}`)).body
    expect(after).toMatchObject({ status: 'idle', turnCount: 0 })
    // With the artifact deleted, the same message runs.
    expect((await api.call('DELETE', `/v1/agents/shell/artifacts/${filled.body.id}`)).status).toBe(200)
    expect((await api.send(session, 'echo kept')).text).toMatch(/^kept\n/)
  })
})

describe("the budget's check", () => {
  it("reads the tenant's counters, not every row it stores (work that would grow with the install)", async () => {
    // The tenant holds turn events, command rows (the tests above); a command's start reserves its log.
    const session = (await t.api.createSession('shell')).id
    const sent: string[] = []
    const stop = t.server.statements.listen((statement) => sent.push(statement.replace(/"/g, '')))
    let started: Awaited<ReturnType<Api['call']>>
    try {
      started = await t.api.call('POST', `/v1/sessions/${session}/commands`, { command: ['true'] })
    } finally {
      stop()
    }
    expect([201, 507]).toContain(started.status)
    const scans = sent.filter((statement) =>
      /\b(from|join)\s+(turn_events|artifacts|commands)\b/i.test(statement),
    )
    expect(scans, sent.join('\n')).toEqual([])
    expect(sent.filter((statement) => /\bfrom\s+tenant_storage\b/i.test(statement))).toHaveLength(1)
  })
})

describe('GET /v1/usage', () => {
  it("shows the bytes the budget's check counts: the tenant's counters, not sums of its rows", async () => {
    // The tenant holds an artifact (and commands, when the tests above ran).
    const session = (await t.api.createSession('shell')).id
    await t.api.send(session, 'echo kept > kept.txt')
    const saved = await t.api.call('POST', `/v1/sessions/${session}/artifacts`, { path: 'kept.txt' })
    expect(saved.status, JSON.stringify(saved.body)).toBe(201)
    const sent: string[] = []
    const stop = t.server.statements.listen((statement) => sent.push(statement.replace(/"/g, '')))
    let usage: Awaited<ReturnType<Api['call']>>
    try {
      usage = await t.api.call('GET', '/v1/usage')
    } finally {
      stop()
    }
    expect(usage.status).toBe(200)
    expect(usage.body.artifacts).toMatchObject({ count: 1, bytes: 5 })
    // Before, the usage summed the tenant's artifacts and command windows (its own figures, work
    // that grows with the install); now it reads the counters' row the check reads.
    const sums = sent.filter((statement) => /\bsum\s*\(/i.test(statement))
    expect(sums.filter((statement) => /\b(from|join)\s+(artifacts|commands)\b/i.test(statement))).toEqual([])
    expect(sent.filter((statement) => /\bfrom\s+tenant_storage\b/i.test(statement))).toHaveLength(1)
  })
})

// Last: it closes the file's server. Before, the allowances a process held for its tenants' turns
// (one reservation row per tenant) stayed in the database after it stopped, counted against each
// tenant until its lease ran out, and were never removed.
describe("the server's close", () => {
  it("releases the reservations it held for its tenants' turns", async () => {
    const { api, session } = await shellTenant('tenant-closing')
    expect((await api.send(session, 'echo kept')).text).toMatch(/^kept\n/)
    expect(await turnReservations()).toBeGreaterThan(0)
    closed = true
    let left = -1
    await closeOwned(t, async () => {
      left = await turnReservations()
    })
    expect(left).toBe(0)
  })
})

/** The file server's database, opened with a connection of its own. */
async function withDatabase<T>(read: (db: Db) => Promise<T>): Promise<T> {
  const db = await openDatabase((await testDatabaseFor(t.dataDir)) ?? path.join(t.dataDir, 'cairn.db'))
  try {
    return await read(db)
  } finally {
    await db.close()
  }
}

/** Rows reserving bytes for turns (any process's allowance for any tenant). */
function turnReservations(): Promise<number> {
  return withDatabase(async (db) => {
    const rows = await sql<{ n: number | string }>`
      SELECT COUNT(*) AS n FROM storage_reservations WHERE purpose = ${TURNS_PURPOSE}`.execute(db.kysely)
    return Number(rows.rows[0]?.n ?? 0)
  })
}

/** The bytes of the session's stored stream events and transcript, read with SQL of its own. */
function keptBytes(sessionId: string): Promise<{ events: number; transcript: number }> {
  return withDatabase(async (db) => {
    const size = (column: string) =>
      sql.raw(db.dialect === 'postgres' ? `octet_length(${column})` : `length(CAST(${column} AS BLOB))`)
    const events = await sql<{ bytes: number | string | null }>`
      SELECT SUM(${size('e.event')}) AS bytes FROM turn_events e JOIN turns t ON t.id = e.turn_id
      WHERE t.session_id = ${sessionId}`.execute(db.kysely)
    const transcript = await sql<{ bytes: number | string | null }>`
      SELECT SUM(${size('t.prompt')} + ${size('t.response')} + ${size('t.stderr')}) AS bytes FROM turns t
      WHERE t.session_id = ${sessionId}`.execute(db.kysely)
    return {
      events: Number(events.rows[0]?.bytes ?? 0),
      transcript: Number(transcript.rows[0]?.bytes ?? 0),
    }
  })
}
