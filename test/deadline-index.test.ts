import path from 'node:path'
import type {
  KyselyPlugin,
  OperationNode,
  PluginTransformQueryArgs,
  PluginTransformResultArgs,
  QueryId,
  QueryResult,
  RootOperationNode,
  UnknownRow,
} from 'kysely'
import pino from 'pino'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { Db, openDatabase } from '../packages/server/src/db/database.js'
import { SessionReaper } from '../packages/server/src/sessions/reaper.js'
import { SessionStore } from '../packages/server/src/sessions/session-store.js'
import { TurnLocks } from '../packages/server/src/sessions/turn-locks.js'
import { testDatabaseFor } from './fixtures/test-database.mjs'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

/** Counts the rows each query on the sessions table returns (and the session IDs among them). */
class SessionRowsRead implements KyselyPlugin {
  rows = 0
  readonly ids: string[] = []
  private readonly onSessions = new WeakSet<QueryId>()

  transformQuery(args: PluginTransformQueryArgs): RootOperationNode {
    if (args.node.kind === 'SelectQueryNode' && readsSessions(args.node)) this.onSessions.add(args.queryId)
    return args.node
  }

  async transformResult(args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    if (this.onSessions.has(args.queryId)) {
      this.rows += args.result.rows.length
      for (const row of args.result.rows) if (typeof row.id === 'string') this.ids.push(row.id)
    }
    return args.result
  }

  reset(): void {
    this.rows = 0
    this.ids.length = 0
  }
}

/** Whether the query's FROM names the sessions table (aliased or not). */
function readsSessions(node: OperationNode): boolean {
  const from = (node as { from?: { froms: OperationNode[] } }).from
  return (from?.froms ?? []).some((f) => JSON.stringify(f).includes('"name":"sessions"'))
}

let t: TestServer
let counted: Db
const reads = new SessionRowsRead()

beforeAll(async () => {
  t = await startTestServer()
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
  // The server's own database, opened again with every row read from the sessions table counted.
  const base = await openDatabase((await testDatabaseFor(t.dataDir)) ?? path.join(t.dataDir, 'cairn.db'))
  counted = new Db(base.kysely.withPlugin(reads), base.dialect)
})

afterAll(async () => {
  await counted?.close()
  await t?.close()
})

describe('the deadline index', () => {
  it('a reaper pass reads the sessions due, not every idle session of the install', async () => {
    const quiet = []
    for (let i = 0; i < 30; i++) quiet.push((await t.api.createSession('shell')).id)
    const due = []
    for (let i = 0; i < 3; i++)
      due.push((await t.api.createSession('shell', { idleTimeoutMs: 3_600_000 })).id)

    // A reaper as a cluster's leader runs it (every session of the install), two hours from now:
    // the three sessions with a one-hour idle timeout are due, the thirty with thirty days are not.
    const store = new SessionStore(counted, 'rt_leader_of_the_test', () => undefined)
    const reaper = new SessionReaper({
      clock: { now: () => Date.now() + 2 * 3_600_000 },
      logger: pino({ level: 'silent' }),
      store,
      locks: new TurnLocks(),
      warm: { drop: (id) => t.server.sessions.stopSandbox(id) },
      cancelTurn: (id) => t.server.sessions.cancel('tnt_default', id),
      deleteSession: (tenantId, id, cause, detail) => t.server.sessions.delete(tenantId, id, cause, detail),
    })
    reads.reset()
    await reaper.reapDue()
    const readIds = new Set(reads.ids)
    console.log(`[deadline-index] ${reads.rows} session rows read for 3 due of 33 idle`)
    expect([...readIds].sort()).toEqual([...due].sort())
    expect(reads.rows).toBeLessThanOrEqual(3 * due.length)
    for (const id of due)
      expect((await t.api.call('GET', `/v1/sessions/${id}`)).body).toMatchObject({
        status: 'timeout',
        statusCause: 'idle_timeout',
      })
    for (const id of quiet.slice(0, 3))
      expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.status).toBe('idle')

    // The next deadline (what the reaper's timer is armed for) is one row of the index.
    reads.reset()
    const next = await store.deadlines.next()
    expect(reads.rows).toBe(1)
    expect(next).toBeGreaterThan(Date.now() + 29 * 24 * 3_600_000)
  })

  it('a session whose activity moved its timeout later is read once, then not until its new time', async () => {
    const session = (await t.api.createSession('shell', { idleTimeoutMs: 3_600_000 })).id
    const created = Date.parse((await t.api.call('GET', `/v1/sessions/${session}`)).body.lastActiveAt)
    await new Promise((r) => setTimeout(r, 1500))
    // Activity: a file written through the API; its idle timeout now counts from here.
    const put = await t.api.call('PUT', `/v1/sessions/${session}/files/content?path=a.txt`, 'x', {
      'content-type': 'application/octet-stream',
    })
    expect(put.status).toBe(200)
    const active = Date.parse((await t.api.call('GET', `/v1/sessions/${session}`)).body.lastActiveAt)
    expect(active).toBeGreaterThanOrEqual(created + 1500)

    let nowMs = created + 3_600_000 + 500
    const store = new SessionStore(counted, 'rt_leader_of_the_test', () => undefined)
    const reaper = new SessionReaper({
      clock: { now: () => nowMs },
      logger: pino({ level: 'silent' }),
      store,
      locks: new TurnLocks(),
      warm: { drop: (id) => t.server.sessions.stopSandbox(id) },
      cancelTurn: (id) => t.server.sessions.cancel('tnt_default', id),
      deleteSession: (tenantId, id, cause, detail) => t.server.sessions.delete(tenantId, id, cause, detail),
    })
    // Due by its first time, not by its true one: read, left idle, its true time written back.
    reads.reset()
    expect(await reaper.reapDue()).toEqual({ considered: 1, timedOut: 0 })
    expect(new Set(reads.ids)).toEqual(new Set([session]))
    expect((await t.api.call('GET', `/v1/sessions/${session}`)).body.status).toBe('idle')
    reads.reset()
    expect(await reaper.reapDue()).toEqual({ considered: 0, timedOut: 0 })
    expect(reads.rows).toBe(0)
    // At its true time it times out.
    nowMs = active + 3_600_000
    expect(await reaper.reapDue()).toEqual({ considered: 1, timedOut: 1 })
    expect((await t.api.call('GET', `/v1/sessions/${session}`)).body).toMatchObject({
      status: 'timeout',
      statusCause: 'idle_timeout',
    })
  })
})
