import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { openDatabase } from '../../packages/server/src/db/database.js'
import { testDatabaseFor } from '../fixtures/test-database.mjs'
import { KEEPER_PROJECT, makeProject } from '../helpers/projects.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'

const servers: TestServer[] = []
let dataDir = ''

afterAll(async () => {
  for (const s of servers) await s.close().catch(() => undefined)
  if (dataDir) await rm(dataDir, { recursive: true, force: true })
})

async function snapshotTurns(api: Api, sessionId: string): Promise<number[]> {
  const list = await api.call('GET', `/v1/sessions/${sessionId}/snapshots`)
  return (list.body.data as { turn: number }[]).map((s) => s.turn)
}

describe('turn atomicity after a crash', () => {
  it('an interrupted turn that never reached the agent gets its pre-turn snapshot at start-up, so it can be undone', async () => {
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-interrupted-'))
    const first = await startTestServer({ dataDir })
    servers.push(first)
    const project = await makeProject(KEEPER_PROJECT)
    expect((await first.api.deploy(project)).status).toBe(201)
    const session = await first.api.createSession('keeper')
    expect((await first.api.send(session.id, 'one')).text).toBe('kept one\n')
    await first.api.snapshotAfter(session.id, 1)
    await first.close()
    servers.splice(servers.indexOf(first), 1)

    // The database as a kill -9 leaves it right after turn 2 was recorded and before the snapshot
    // that follows turn 1 was (it is taken in the background when turn 1 ends): the turn row is
    // `running`, the session `active`, and no snapshot row for turn 1.
    // Written through the server's own data layer, on whichever database the suite runs on.
    const db = await openDatabase((await testDatabaseFor(dataDir)) ?? path.join(dataDir, 'cairn.db'))
    const now = new Date().toISOString()
    await db.kysely
      .deleteFrom('snapshots')
      .where('session_id', '=', session.id)
      .where('turn_seq', '=', 1)
      .execute()
    await db.kysely
      .insertInto('turns')
      .values({
        id: 'turn_crashed0000000000000',
        session_id: session.id,
        seq: 2,
        status: 'running',
        prompt: 'two',
        started_at: now,
      })
      .execute()
    await db.kysely
      .updateTable('sessions')
      .set((eb) => ({ status: 'active', turn_count: 2, message_count: eb('message_count', '+', 1) }))
      .where('id', '=', session.id)
      .execute()
    await db.close()

    const second = await startTestServer({ dataDir })
    servers.push(second)
    const api = new Api(second.url, first.key)
    expect((await api.call('GET', `/v1/sessions/${session.id}`)).body).toMatchObject({
      status: 'idle',
      statusCause: 'server_restart',
    })
    const turns = (await api.call('GET', `/v1/sessions/${session.id}/turns`)).body.data
    expect(turns.map((t: { status: string }) => t.status)).toEqual(['completed', 'interrupted'])
    expect(await snapshotTurns(api, session.id)).toContain(1)

    const undo = await api.call('POST', `/v1/sessions/${session.id}/undo`)
    expect(undo.status).toBe(200)
    expect(undo.body.snapshot.turn).toBe(1)
    expect((await api.send(session.id, 'three')).text).toBe('kept one three\n')
  })
})
