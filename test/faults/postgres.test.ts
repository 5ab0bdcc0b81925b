import { openDatabase } from '@cairn/server'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { TestPostgres } from '../helpers/postgres.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// PostgreSQL failing under a running server: its connections dropped (a failover, an operator's
// pg_terminate_backend), the server restarted, or gone for longer than a turn waits. Each ends in
// a finished turn or a typed, retryable error, and the session goes on; no turn hangs. The cluster
// is this file's own: stopping it must not disturb other tests.
let postgres: TestPostgres
let t: TestServer
let database = ''

beforeAll(async () => {
  postgres = await TestPostgres.start()
  const url = await postgres.createDatabase()
  database = new URL(url).pathname.slice(1)
  t = await startTestServer({ server: { database: url } })
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
}, 120_000)

afterAll(async () => {
  await t?.close()
  await postgres?.stop()
})

async function turnsOf(sessionId: string): Promise<{ seq: number; status: string; response: string }[]> {
  return (await t.api.call('GET', `/v1/sessions/${sessionId}/turns`)).body.data
}

describe('PostgreSQL failing under a running server', () => {
  it('finishes a turn whose connections were dropped while it ran, and takes the next message', async () => {
    const session = await t.api.createSession('shell')
    const running = t.api.send(session.id, 'sleep 2 && echo survived')
    await new Promise((r) => setTimeout(r, 700))
    expect(await postgres.terminateConnections(database)).toBeGreaterThan(0)
    const turn = await running
    expect(turn.terminal?.type).toBe('run.completed')
    expect(turn.text).toContain('survived')
    // Dropped again between turns: a request that meets a connection the pool has not yet seen
    // die is refused 503 unavailable (nothing recorded); the pool then opens new ones.
    await postgres.terminateConnections(database)
    let next = await t.api.send(session.id, 'echo next')
    if (next.status === 503) {
      expect(next.body).toMatchObject({ error: { code: 'unavailable' } })
      next = await t.api.send(session.id, 'echo next')
    }
    expect(next.text).toContain('next')
    expect((await turnsOf(session.id)).map((x) => [x.seq, x.status])).toEqual([
      [1, 'completed'],
      [2, 'completed'],
    ])
  })

  it('answers 503 unavailable while PostgreSQL is down, and a turn spanning its restart is recorded', async () => {
    const session = await t.api.createSession('shell')
    const running = t.api.send(session.id, 'sleep 3 && echo across the restart')
    await new Promise((r) => setTimeout(r, 700))
    await postgres.stopServer()
    const down = await t.api.call('GET', `/v1/sessions/${session.id}`)
    expect(down.status).toBe(503)
    expect(down.body.error.code).toBe('unavailable')
    await postgres.startServer()
    const turn = await running
    expect(turn.terminal?.type).toBe('run.completed')
    expect(turn.text).toContain('across the restart')
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body).toMatchObject({
      status: 'idle',
      turnCount: 1,
    })
    expect((await t.api.send(session.id, 'echo resumed')).text).toContain('resumed')
  })

  it('answers 503 unavailable within its bound while PostgreSQL does not answer, and recovers when it does', async () => {
    const session = await t.api.createSession('shell')
    expect((await t.api.send(session.id, 'echo before')).text).toContain('before')
    // Frozen, not stopped: its connections stay open and nothing answers (a hung server, a
    // partition). A request waits for it about 2 s of silence and a 2 s probe (POSTGRES_QUERY_
    // TIMEOUT_MS each); 8 s here is a correctness bound (the outage lasts longer), not a speed claim.
    await postgres.pause()
    const thawAt = setTimeout(() => void postgres.resume(), 20_000)
    try {
      const timed = async (request: () => Promise<{ status: number; body: unknown }>) => {
        const startedAt = Date.now()
        const res = await request()
        return { ...res, ms: Date.now() - startedAt }
      }
      const answers = await Promise.all([
        timed(() => t.api.call('GET', `/v1/sessions/${session.id}`)),
        timed(() => t.api.call('GET', '/v1/sessions')),
        timed(() => t.api.call('POST', '/v1/sessions', { agent: 'shell' })),
        timed(() => t.api.send(session.id, 'echo during')),
      ])
      for (const answer of answers) {
        expect(answer.status).toBe(503)
        expect(answer.body).toMatchObject({ error: { code: 'unavailable' } })
        expect(answer.ms).toBeLessThan(8000)
      }
    } finally {
      clearTimeout(thawAt)
      await postgres.resume()
    }
    // Back: the connections that timed out were dropped, new ones answer.
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body).toMatchObject({ status: 'idle' })
    expect((await t.api.send(session.id, 'echo after')).text).toContain('after')
  }, 60_000)

  it('tells the client unavailable when PostgreSQL stays down past the turn, then records it and resumes', async () => {
    const session = await t.api.createSession('shell')
    const running = t.api.send(session.id, 'sleep 1 && echo unrecorded for now')
    await new Promise((r) => setTimeout(r, 300))
    await postgres.stopServer()
    const turn = await running
    expect(turn.text).toContain('unrecorded for now')
    expect(turn.terminal).toMatchObject({ type: 'run.failed', error: { code: 'unavailable' } })
    await postgres.startServer()
    // Recorded behind once the database is back; the session's running turn ends with it.
    let turns: { seq: number; status: string; response: string }[] = []
    for (let i = 0; i < 100; i++) {
      const res = await t.api.call('GET', `/v1/sessions/${session.id}/turns`)
      turns = res.status === 200 ? res.body.data : []
      if (turns[0]?.status === 'completed') break
      await new Promise((r) => setTimeout(r, 200))
    }
    expect(turns.map((x) => [x.seq, x.status])).toEqual([[1, 'completed']])
    expect(turns[0]?.response).toContain('unrecorded for now')
    expect((await t.api.send(session.id, 'echo after')).text).toContain('after')
  }, 60_000)

  it('lets go of a session hold whose release the database did not take, once it does: not 60 s of session_busy later', async () => {
    const session = await t.api.createSession('shell')
    const snapshot = () => t.api.call('POST', `/v1/sessions/${session.id}/snapshots`, { label: 'held' })
    // While this trigger stands PostgreSQL refuses to clear the session's hold, as an outage
    // did when a snapshot's release met a restart (the cluster model test's soak).
    await postgres.sql(
      `CREATE FUNCTION refuse_release() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF OLD.held_by IS NOT NULL AND NEW.held_by IS NULL THEN RAISE EXCEPTION 'release refused by the test'; END IF; RETURN NEW; END $$; CREATE TRIGGER refuse_release BEFORE UPDATE ON sessions FOR EACH ROW EXECUTE FUNCTION refuse_release()`,
      database,
    )
    try {
      expect((await snapshot()).status).toBe(201)
      const held = await snapshot()
      expect(held.status).toBe(409)
      expect(held.body.error).toMatchObject({ code: 'session_busy' })
      expect(held.body.error.message).toContain('busy with a snapshot')
    } finally {
      await postgres.sql('DROP TRIGGER refuse_release ON sessions; DROP FUNCTION refuse_release()', database)
    }
    // The release is tried again every second: the session is free within seconds, well inside
    // the hold's 60 s (it stayed held until then).
    const deadline = Date.now() + 10_000
    let answer = await snapshot()
    while (answer.status === 409 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 250))
      answer = await snapshot()
    }
    expect(answer.status, JSON.stringify(answer.body)).toBe(201)
  }, 60_000)

  it('waits out a lock another process holds past the bound while the pool is quiet: the database answers, so nothing fails', async () => {
    // The server's own database handle, opened alone, so that nothing else of this process asks
    // PostgreSQL anything meanwhile (a replica with little traffic): an outside transaction holds
    // every tenant's row for 3.5 s while the handle waits to lock one. A bound on one statement's
    // time, or on the pool's own silence alone, failed it after 2 s as the database not answering.
    const db = await openDatabase(postgres.url(database))
    const outside = new pg.Client({ connectionString: postgres.url(database) })
    await outside.connect()
    try {
      await outside.query('BEGIN')
      await outside.query('SELECT id FROM tenants FOR UPDATE')
      const release = setTimeout(() => void outside.query('COMMIT'), 3500)
      const startedAt = Date.now()
      const locked = await db.kysely.selectFrom('tenants').select('id').forUpdate().execute()
      clearTimeout(release)
      expect(locked.length).toBeGreaterThan(0)
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(3000)
    } finally {
      await outside.query('ROLLBACK').catch(() => {})
      await outside.end()
      await db.close()
    }
  })
})
