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

  it('reads through one replica that meet restores through the other answer 200 or 409 (or 429), never 404 or 5xx', async () => {
    const { id, snapshotId } = await sessionWithSnapshot()
    const statuses = new Map<string, number>()
    let restoring = true
    // Three readers: a file's content, and listings of the workspace (a walk).
    const reader = (route: string) => async () => {
      while (restoring) {
        const read = await one.call('GET', route)
        const key = `${read.status} ${code(read.body) ?? ''}`.trim()
        statuses.set(key, (statuses.get(key) ?? 0) + 1)
      }
    }
    const content = reader(`/v1/sessions/${id}/files/content?path=f.txt`)
    const listing = reader(`/v1/sessions/${id}/files?path=`)
    const reads = Promise.all([content(), content(), listing()])
    try {
      for (let i = 0; i < 30; i++) {
        const restored = await two.call('POST', `/v1/sessions/${id}/restore`, { snapshotId })
        expect(restored.status).toBe(200)
      }
    } finally {
      restoring = false
      await reads
    }
    console.log('[replica-exclusivity] reads during restores', JSON.stringify(Object.fromEntries(statuses)))
    for (const key of statuses.keys()) expect(['200', '409 session_busy', '429 rate_limited']).toContain(key)
  })

  it('writes through one replica that meet restores through the other answer success or 409, never 5xx', async () => {
    const { id, snapshotId } = await sessionWithSnapshot()
    const statuses = new Map<string, number>()
    let restoring = true
    const writer = async (n: number) => {
      for (let i = 0; restoring; i++) {
        const path = `w${n}-${i}.txt`
        const put = await fetch(`${one.url}/v1/sessions/${id}/files/content?path=${path}`, {
          method: 'PUT',
          headers: { authorization: `Bearer ${one.key}`, 'content-type': 'application/octet-stream' },
          body: `write ${n}.${i}`,
        })
        const del = await one.call('DELETE', `/v1/sessions/${id}/files?path=${path}`)
        for (const [status, body] of [
          [put.status, await put.json()],
          [del.status, del.body],
        ] as const) {
          const key = `${status < 300 ? '2xx' : status} ${code(body) ?? ''}`.trim()
          statuses.set(key, (statuses.get(key) ?? 0) + 1)
        }
      }
    }
    const writers = Promise.all([writer(0), writer(1)])
    try {
      for (let i = 0; i < 20; i++) {
        // Gaps between restores, so writes find the session free as well as held.
        await new Promise((r) => setTimeout(r, 40))
        const restored = await two.call('POST', `/v1/sessions/${id}/restore`, { snapshotId })
        expect([200, 409]).toContain(restored.status)
      }
    } finally {
      restoring = false
      await writers
    }
    console.log('[replica-exclusivity] writes during restores', JSON.stringify(Object.fromEntries(statuses)))
    for (const key of statuses.keys())
      expect(['2xx', '409 session_busy', '404 not_found', '429 rate_limited']).toContain(key)
    // Once nothing races it, a write answered with success is in the workspace, read through either.
    const put = await fetch(`${one.url}/v1/sessions/${id}/files/content?path=kept.txt`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${one.key}`, 'content-type': 'application/octet-stream' },
      body: 'kept',
    })
    expect(put.status).toBeLessThan(300)
    expect((await two.call('GET', `/v1/sessions/${id}/files/content?path=kept.txt`)).body).toBe('kept')
  })

  it('a hold another replica took refuses messages, file writes, snapshots and deletion until it lapses', async () => {
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
      const deleted = await two.call('DELETE', `/v1/sessions/${id}`)
      expect(deleted.status).toBe(409)
      expect(code(deleted.body)).toBe('session_busy')
      // A replica that died holding it: the hold lapses.
      await hold(-1000)
      expect((await one.send(id, 'echo after')).terminal?.type).toBe('run.completed')
    } finally {
      await client.end()
    }
  })
})

describe.skipIf(testsRunOnPostgres())('a turn through one API replica, stopped through the other', () => {
  async function runningTurn(): Promise<{ id: string; turn: ReturnType<Api['send']> }> {
    const { id } = await one.createSession('shell')
    const turn = one.send(id, 'echo working; sleep 30')
    const client = new pg.Client({ connectionString: cluster.databaseUrl })
    await client.connect()
    try {
      for (let i = 0; i < 200; i++) {
        const { rows } = await client.query(`SELECT status FROM turns WHERE session_id = $1`, [id])
        if (rows[0]?.status === 'running') break
        await new Promise((r) => setTimeout(r, 50))
      }
    } finally {
      await client.end()
    }
    return { id, turn }
  }

  it('a cancel through two of a turn sent through one cancels it and answers ok', async () => {
    const { id, turn } = await runningTurn()
    const cancelled = await two.call('POST', `/v1/sessions/${id}/cancel`)
    expect(cancelled, JSON.stringify(cancelled.body)).toEqual({ status: 200, body: { ok: true } })
    const result = await turn
    expect(result.terminal?.type, JSON.stringify(result.terminal ?? result.body)).toBe('run.cancelled')
    expect((await two.send(id, 'echo next')).terminal?.type).toBe('run.completed')
  }, 60_000)

  it('an end through two of a turn running through one cancels the turn, then ends the session', async () => {
    const { id, turn } = await runningTurn()
    const ended = await two.call('POST', `/v1/sessions/${id}/end`)
    expect(ended.status, JSON.stringify(ended.body)).toBe(200)
    expect((ended.body as { status?: string }).status).toBe('completed')
    const result = await turn
    expect(result.terminal?.type, JSON.stringify(result.terminal ?? result.body)).toBe('run.cancelled')
    expect((await one.call('GET', `/v1/sessions/${id}`)).body).toMatchObject({ status: 'completed' })
  }, 60_000)
})
