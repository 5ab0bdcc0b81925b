import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type ApiReplicas, startApiReplicas } from '../helpers/api-replicas.js'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import type { Api } from '../helpers/server.js'

// One session reached through two API replicas (`--role api`) in front of one node. What a single
// server refuses because its turn lock is held (a restore while a turn runs, a turn while a restore
// swaps the workspace) must be refused the same when the two calls come through different
// replicas, which share the database and nothing else.
let cluster: ApiReplicas
let one: Api
let two: Api

beforeAll(async () => {
  cluster = await startApiReplicas(2, 'replica-exclusivity')
  one = cluster.api(0)
  two = cluster.api(1)
  expect((await one.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
}, 180_000)

afterAll(async () => {
  await cluster?.close()
})

const code = (body: unknown) => (body as { error?: { code?: string } } | undefined)?.error?.code

async function sessionWithSnapshot(): Promise<{ id: string; snapshotId: string }> {
  const { id } = await one.createSession('shell')
  expect((await one.send(id, 'echo first > f.txt')).text).toContain('[exit 0]')
  const snap = await one.call('POST', `/v1/sessions/${id}/snapshots`, { label: 'before' })
  expect(snap.status).toBe(201)
  return { id, snapshotId: (snap.body as { id: string }).id }
}

describe.skipIf(testsRunOnPostgres())('one session through two API replicas', () => {
  it('a restore through one replica while a turn runs through the other answers session_busy; the turn completes', async () => {
    const { id, snapshotId } = await sessionWithSnapshot()
    const turn = one.send(id, 'sleep 2; echo second > g.txt')
    // The turn has begun (its session is active) before the restore is asked.
    for (let i = 0; i < 100; i++) {
      const info = await two.call('GET', `/v1/sessions/${id}`)
      if ((info.body as { status?: string }).status === 'active') break
      await new Promise((r) => setTimeout(r, 20))
    }
    const restored = await two.call('POST', `/v1/sessions/${id}/restore`, { snapshotId })
    expect(restored.status).toBe(409)
    expect(code(restored.body)).toBe('session_busy')
    const result = await turn
    expect(result.terminal?.type).toBe('run.completed')
    const file = await two.call('GET', `/v1/sessions/${id}/files/content?path=g.txt`)
    expect(file.status).toBe(200)
  })

  it('raced through both replicas, turns and restores never cut each other: a turn completes or is refused', async () => {
    const { id, snapshotId } = await sessionWithSnapshot()
    const outcomes = new Map<string, number>()
    const count = (key: string) => outcomes.set(key, (outcomes.get(key) ?? 0) + 1)
    for (let round = 0; round < 12; round++) {
      const [turn, restored] = await Promise.all([
        one.send(id, `echo ${round} >> rounds.txt; sleep 0.2`),
        (async () => {
          await new Promise((r) => setTimeout(r, (round % 4) * 40))
          return two.call('POST', `/v1/sessions/${id}/restore`, { snapshotId })
        })(),
      ])
      const turnOutcome = turn.terminal?.type ?? `${turn.status} ${code(turn.body)}`
      count(`turn ${turnOutcome}`)
      count(`restore ${restored.status} ${code(restored.body) ?? ''}`.trim())
      expect(['run.completed', '409 session_busy']).toContain(turnOutcome)
      expect([200, 409]).toContain(restored.status)
    }
    console.log('[replica-exclusivity] outcomes', JSON.stringify(Object.fromEntries(outcomes)))
  })

  it('a hold another replica took refuses messages and file writes until it is released or lapses', async () => {
    const { id } = await one.createSession('shell')
    expect((await one.send(id, 'echo hi')).text).toContain('[exit 0]')
    const client = new pg.Client({ connectionString: cluster.databaseUrl })
    await client.connect()
    try {
      // As a replica in the middle of a restore holds it.
      const hold = (untilMs: number) =>
        client.query(
          `UPDATE sessions SET held_for = 'a restore', held_by = 'elsewhere', held_until = $1 WHERE id = $2`,
          [new Date(Date.now() + untilMs).toISOString(), id],
        )
      await hold(60_000)
      const message = await one.send(id, 'echo during')
      expect(message.status).toBe(409)
      expect(code(message.body)).toBe('session_busy')
      const write = await fetch(`${two.url}/v1/sessions/${id}/files/content?path=during.txt`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${two.key}`, 'content-type': 'text/plain' },
        body: 'written while held',
      })
      expect(write.status).toBe(409)
      expect(code(await write.json())).toBe('session_busy')
      const snapshot = await two.call('POST', `/v1/sessions/${id}/snapshots`, {})
      expect(code(snapshot.body)).toBe('session_busy')
      // A replica that died holding it: the hold lapses.
      await hold(-1000)
      expect((await one.send(id, 'echo after')).terminal?.type).toBe('run.completed')
    } finally {
      await client.end()
    }
  })
})
