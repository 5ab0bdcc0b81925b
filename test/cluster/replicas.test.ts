import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { openDatabase } from '../../packages/server/src/db/database.js'
import { TestPostgres, testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { Api, type RunResult, startTestServer, type TestServer } from '../helpers/server.js'

// Two API replicas on one PostgreSQL, each with its own runtime (data dir, pool, sandboxes). Every
// message is sent three times at once: twice to the session's replica, once to the other one.
// The database must end up with each session's turns exactly once, in order, none overlapping,
// and every reply a client was given in its transcript.
const SESSIONS = Number(process.env.CAIRN_CLUSTER_SESSIONS ?? 200)
const TURNS = 10
const PARALLEL = 12
const ECHO = (name: string) => ({
  'cairn.yaml': `name: ${name}\ncommand: bash agent.sh\n`,
  'agent.sh': 'while IFS= read -r line; do echo "got $line"; done\n',
})

let postgres: TestPostgres
let url = ''
const replicas: TestServer[] = []

beforeAll(async () => {
  postgres = await TestPostgres.start()
  url = await postgres.createDatabase()
  // One after the other: the second finds the install (its key, its secrets key) in the database.
  for (let i = 0; i < 2; i++) replicas.push(await startTestServer({ server: { database: url } }))
}, 120_000)

afterAll(async () => {
  for (const r of replicas) await r.close().catch(() => undefined)
  await postgres?.stop()
})

// On a PostgreSQL of its own in either pass of the suite: run once (the SQLite pass).
describe.skipIf(testsRunOnPostgres())('two API replicas on one PostgreSQL', () => {
  it(`runs ${SESSIONS} sessions × ${TURNS} turns raced through both: no lost entry, no double turn`, async () => {
    const [one, two] = replicas as [TestServer, TestServer]
    const key = one.key
    expect(key).not.toBe('')
    expect(two.server.adminKey).toBeUndefined()
    const apis = [new Api(one.url, key), new Api(two.url, key)] as const
    // A revision lives in the pool of the replica that built it: one agent per replica.
    for (const [i, api] of apis.entries())
      expect((await api.deploy(await makeProject(ECHO(`echo-${i}`)))).status).toBe(201)

    const owners: number[] = []
    const ids: string[] = []
    for (let s = 0; s < SESSIONS; s++) {
      const owner = s % 2
      const session = await apis[owner].createSession(`echo-${owner}`, { keepWarmMs: 2000 })
      ids.push(session.id)
      owners.push(owner)
    }
    // The other replica names the owner instead of acting on a session it does not hold.
    const elsewhere = await apis[1].send(ids[0] as string, 'wrong replica')
    expect(elsewhere.status).toBe(421)
    expect(elsewhere.body).toMatchObject({ error: { code: 'session_elsewhere' } })

    const answered = new Map<string, string[]>()
    const refusals = new Map<string, number>()
    const count = (key: string) => refusals.set(key, (refusals.get(key) ?? 0) + 1)
    const runSession = async (index: number) => {
      const id = ids[index] as string
      const owner = apis[owners[index] as number]
      const other = apis[1 - (owners[index] as number)]
      const replies: string[] = []
      let attempt = 0
      while (replies.length < TURNS) {
        const prompt = `${id} message ${replies.length + 1} attempt ${attempt++}`
        const results: RunResult[] = await Promise.all([
          owner.send(id, prompt),
          owner.send(id, prompt),
          other.send(id, prompt),
        ])
        // The other replica never runs a turn on a session it does not hold: it names the owner
        // (421), or says the session is busy when the owner's turn is under way.
        const fromOther = results[2] as RunResult
        expect(fromOther.terminal?.type).not.toBe('run.completed')
        expect(['session_elsewhere', 'session_busy']).toContain(
          (fromOther.body as { error?: { code?: string } } | undefined)?.error?.code,
        )
        for (const result of results) {
          if (result.terminal?.type === 'run.completed') {
            expect(result.text).toBe(`got ${prompt}\n`)
            replies.push(prompt)
          } else {
            const code = (result.body as { error?: { code?: string } } | undefined)?.error?.code
            count(code ?? `${result.terminal?.type}`)
            expect(['session_busy', 'session_elsewhere', 'sandbox_limit_reached']).toContain(code)
          }
        }
      }
      answered.set(id, replies)
    }
    let next = 0
    await Promise.all(
      Array.from({ length: PARALLEL }, async () => {
        while (next < SESSIONS) await runSession(next++)
      }),
    )
    console.log(`[cluster] refusals: ${JSON.stringify(Object.fromEntries(refusals))}`)
    // Each session's messages were sent to its other replica too (one an attempt; an attempt can
    // answer two of the owner's sends when the first turn ends before the second arrives).
    expect(refusals.get('session_elsewhere')).toBeGreaterThanOrEqual(SESSIONS)

    // From the database: every answered message is a turn, once, in order, none overlapping.
    const db = await openDatabase(url)
    try {
      const turns = await db.kysely
        .selectFrom('turns')
        .select(['session_id', 'seq', 'status', 'prompt', 'response', 'started_at', 'ended_at'])
        .orderBy('session_id')
        .orderBy('seq')
        .execute()
      const sessions = await db.kysely
        .selectFrom('sessions')
        .select(['id', 'turn_count', 'message_count', 'status', 'runtime_id'])
        .execute()
      expect(turns.filter((t) => t.status !== 'completed')).toEqual([])
      const runtimes = new Set(sessions.map((s) => s.runtime_id))
      expect(runtimes.size).toBe(2)
      for (const [index, id] of ids.entries()) {
        const mine = turns.filter((t) => t.session_id === id)
        expect(mine.map((t) => t.seq)).toEqual(Array.from({ length: mine.length }, (_, i) => i + 1))
        expect(mine.map((t) => t.prompt)).toEqual(answered.get(id))
        for (const t of mine) expect(t.response).toBe(`got ${t.prompt}\n`)
        for (let i = 1; i < mine.length; i++)
          expect((mine[i]?.started_at ?? '') >= (mine[i - 1]?.ended_at ?? '~')).toBe(true)
        const row = sessions.find((s) => s.id === id)
        expect(row).toMatchObject({ turn_count: mine.length, message_count: 2 * mine.length, status: 'idle' })
        // Sessions 0 and 1 were made on replicas one and two: each session shares its owner's runtime.
        expect(row?.runtime_id).toBe(sessions.find((s) => s.id === ids[owners[index] as number])?.runtime_id)
      }
    } finally {
      await db.close()
    }
  }, 1_200_000)
})
