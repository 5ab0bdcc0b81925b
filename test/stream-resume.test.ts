import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { openDatabase } from '../packages/server/src/db/database.js'
import { testDatabaseFor } from './fixtures/test-database.mjs'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { packDir, startTestServer, type TestServer } from './helpers/server.js'
import { deltaText, idsOf, readEvents } from './helpers/sse.js'

// A run's stream that drops (a laptop's Wi-Fi, a proxy's timeout, a replica's restart) is picked
// up again with Last-Event-ID (or `after`): exactly the events missed, then the live ones, then
// the stream closes; a reconnect after the end gets an empty 204 (an EventSource stops there).
let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  const deployed = await t.api.call(
    'POST',
    '/v1/agents?wait=true',
    await packDir(await makeProject(SHELL_PROJECT)),
  )
  expect(deployed.body.revision.status).toBe('READY')
}, 120_000)

afterAll(async () => {
  await t?.close()
})

/** A prompt for the shell agent that answers four lines over about a second. */
const SLOW = 'for i in 1 2 3 4; do echo line-$i; sleep 0.3; done'

function post(sessionId: string, prompt: string, controller: AbortController) {
  return fetch(`${t.url}/v1/sessions/${sessionId}/messages`, {
    method: 'POST',
    headers: { authorization: `Bearer ${t.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt }),
    signal: controller.signal,
  })
}

function resume(sessionId: string, turnId: string, headers: Record<string, string> = {}, query = '') {
  return fetch(`${t.url}/v1/sessions/${sessionId}/turns/${turnId}/events${query}`, {
    headers: { authorization: `Bearer ${t.key}`, ...headers },
  })
}

/** Starts a slow turn and hangs up after its first delta; the turn goes on. */
async function droppedTurn() {
  const { id } = await t.api.createSession('shell')
  const controller = new AbortController()
  const res = await post(id, SLOW, controller)
  expect(res.status).toBe(200)
  const turnId = res.headers.get('cairn-turn-id') ?? ''
  expect(turnId).toMatch(/^trn_/)
  const { messages: before } = await readEvents(res, controller, (m) => m.event === 'message.delta')
  return { id, turnId, before, lastId: before.at(-1)?.id ?? '' }
}

async function waitForTurnEnd(sessionId: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    const turns = (await t.api.call('GET', `/v1/sessions/${sessionId}/turns`)).body.data as {
      status: string
    }[]
    if (turns.length > 0 && turns.every((turn) => turn.status !== 'running')) return
    await new Promise((r) => setTimeout(r, 25))
  }
  throw new Error(`a turn of ${sessionId} still runs`)
}

describe('resumable run streams', () => {
  it('a stream dropped mid-turn, resumed with Last-Event-ID, gets exactly the events missed, then the live ones, then closes', async () => {
    const { id, turnId, before, lastId } = await droppedTurn()
    // Every event of a turn has an id: 1, 2, … in the order sent.
    expect(idsOf(before)).toEqual(before.map((_, i) => i + 1))
    const res = await resume(id, turnId, { 'last-event-id': lastId })
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toContain('text/event-stream')
    const { messages: after, ended } = await readEvents(res)
    expect(ended).toBe(true)
    const all = [...before, ...after]
    expect(idsOf(all)).toEqual(all.map((_, i) => i + 1))
    expect(after.at(-1)?.event).toBe('run.completed')
    const completed = JSON.parse(after.at(-1)?.data ?? '{}') as { text: string }
    expect(deltaText(all)).toBe(completed.text)
    expect(completed.text).toBe('line-1\nline-2\nline-3\nline-4\n[exit 0]\n')
    // The whole stream read again from the start is what the two halves were, byte for byte.
    const { messages: whole } = await readEvents(await resume(id, turnId, {}, '?after=0'))
    expect(whole.map((m) => [m.id, m.event, m.data])).toEqual(all.map((m) => [m.id, m.event, m.data]))
  })

  it('resumed after the turn ended: the remainder, then the stream closes', async () => {
    const { id, turnId, before, lastId } = await droppedTurn()
    await waitForTurnEnd(id)
    const { messages: after, ended } = await readEvents(await resume(id, turnId, {}, `?after=${lastId}`))
    expect(ended).toBe(true)
    const all = [...before, ...after]
    expect(idsOf(all)).toEqual(all.map((_, i) => i + 1))
    expect(after.at(-1)?.event).toBe('run.completed')
    expect(deltaText(all)).toContain('line-4')
  })

  it('a resume at or past the end of an ended turn answers 204 at once; Last-Event-ID wins over after', async () => {
    const { id, turnId } = await droppedTurn()
    await waitForTurnEnd(id)
    const { messages: whole } = await readEvents(await resume(id, turnId))
    const endId = whole.at(-1)?.id ?? ''
    expect(whole.at(-1)?.event).toBe('run.completed')
    for (const [headers, query] of [
      [{ 'last-event-id': endId }, ''],
      [{ 'last-event-id': String(Number(endId) + 50) }, ''],
      [{}, `?after=${endId}`],
      // An EventSource that opened `…?after=0` reconnects to it with the id it last got.
      [{ 'last-event-id': endId }, '?after=0'],
    ] as const) {
      const res = await resume(id, turnId, headers, query)
      expect(res.status, JSON.stringify({ headers, query })).toBe(204)
      expect(await res.text()).toBe('')
    }
    const { messages: tail } = await readEvents(
      await resume(id, turnId, { 'last-event-id': '2' }, '?after=0'),
    )
    expect(idsOf(tail)[0]).toBe(3)
  })

  it('refuses a Last-Event-ID that is not an event id, and a turn of another session', async () => {
    const { id, turnId } = await droppedTurn()
    const bad = await t.api.call('GET', `/v1/sessions/${id}/turns/${turnId}/events`, undefined, {
      'last-event-id': 'abc',
    })
    expect(bad.status).toBe(400)
    expect(bad.body.error.code).toBe('validation_failed')
    const other = await t.api.createSession('shell')
    const elsewhere = await t.api.call('GET', `/v1/sessions/${other.id}/turns/${turnId}/events`)
    expect(elsewhere.status).toBe(404)
    expect(elsewhere.body.error.code).toBe('not_found')
    await waitForTurnEnd(id)
  })
})

describe('a turn whose replica was lost before it wrote its end', () => {
  it('is given its end from its row, at one id for every reader; a reconnect with that id answers 204', async () => {
    const { id } = await t.api.createSession('shell')
    // The database as a replica that died mid-turn leaves it once the turn is failed for it: two
    // events written (one batch), no terminal one; written through the server's own data layer.
    const db = await openDatabase((await testDatabaseFor(t.dataDir)) ?? path.join(t.dataDir, 'cairn.db'))
    const turnId = 'trn_lostreplica000000000'
    const at = new Date().toISOString()
    const events = [
      { type: 'run.started', sessionId: id, turnId, turn: 1, sandboxId: 'sbx_x', coldStart: false },
      { type: 'message.delta', turnId, content: 'half' },
    ]
    try {
      await db.kysely
        .insertInto('turns')
        .values({
          id: turnId,
          session_id: id,
          seq: 1,
          status: 'failed',
          prompt: 'p',
          error_code: 'node_lost',
          error_message: 'its replica was lost',
          started_at: at,
          ended_at: at,
          duration_ms: 5,
        })
        .execute()
      await db.kysely
        .insertInto('turn_events')
        .values(
          events.map((e, i) => ({ turn_id: turnId, seq: i + 1, type: e.type, event: JSON.stringify(e) })),
        )
        .execute()
    } finally {
      await db.close()
    }
    const { messages, ended } = await readEvents(await resume(id, turnId, { 'last-event-id': '1' }))
    expect(ended).toBe(true)
    expect(messages.map((m) => [m.id, m.event])).toEqual([
      ['2', 'message.delta'],
      ['3', 'run.failed'],
    ])
    expect(JSON.parse(messages[1]?.data ?? '{}')).toMatchObject({
      error: { code: 'node_lost', message: 'its replica was lost' },
    })
    // Stored: read again from the start, the same end at the same id.
    const { messages: again } = await readEvents(await resume(id, turnId))
    expect(again.map((m) => [m.id, m.data])).toEqual([
      ['1', JSON.stringify(events[0])],
      ['2', JSON.stringify(events[1])],
      ['3', messages[1]?.data],
    ])
    expect((await resume(id, turnId, { 'last-event-id': '3' })).status).toBe(204)
  })
})

describe('the wire contract', () => {
  it('the OpenAPI document names the resume route, its Last-Event-ID header, its 204, and Cairn-Turn-Id', async () => {
    const doc = (await t.api.call('GET', '/v1/openapi.json')).body
    const resume = doc.paths['/v1/sessions/{id}/turns/{turnId}/events'].get
    expect(resume.parameters.map((p: { name: string; in: string }) => `${p.in} ${p.name}`)).toEqual(
      expect.arrayContaining(['query after', 'header last-event-id', 'path turnId']),
    )
    expect(Object.keys(resume.responses)).toEqual(expect.arrayContaining(['200', '204']))
    const message = doc.paths['/v1/sessions/{id}/messages'].post.responses['200']
    expect(Object.keys(message.headers ?? {})).toContain('Cairn-Turn-Id')
  })
})

describe('a finished build log is not replayed to a reconnecting EventSource', () => {
  it('numbers log lines and the end; a reconnect after a line gets the rest, one at the end a 204', async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: logged\ncommand: bash agent.sh\nsetup: bash setup.sh\n',
      'setup.sh': 'echo one\necho two\necho three\n',
      'agent.sh': 'while read -r l; do echo ok; done\n',
    })
    const deployed = await t.api.call('POST', '/v1/agents?wait=true', await packDir(project))
    expect(deployed.status).toBe(201)
    const logs = `${t.url}/v1/agents/logged/revisions/${deployed.body.revision.id}/logs?follow=true`
    const follow = (headers: Record<string, string> = {}) =>
      fetch(logs, { headers: { authorization: `Bearer ${t.key}`, ...headers } })
    const { messages: whole, ended } = await readEvents(await follow())
    expect(ended).toBe(true)
    expect(whole.at(-1)?.event).toBe('end')
    expect(idsOf(whole)).toEqual(whole.map((_, i) => i + 1))
    const { messages: rest } = await readEvents(await follow({ 'last-event-id': '1' }))
    expect(rest.map((m) => [m.id, m.data])).toEqual(whole.slice(1).map((m) => [m.id, m.data]))
    const again = await follow({ 'last-event-id': whole.at(-1)?.id ?? '' })
    expect(again.status).toBe(204)
  })
})

describe('stored stream events are not kept forever', () => {
  /** How many stream events the database holds for `turnIds`, read through the server's data layer. */
  async function storedEvents(turnIds: string[]): Promise<number> {
    const db = await openDatabase((await testDatabaseFor(t.dataDir)) ?? path.join(t.dataDir, 'cairn.db'))
    try {
      const row = await db.kysely
        .selectFrom('turn_events')
        .select((eb) => eb.fn.countAll().as('n'))
        .where('turn_id', 'in', turnIds)
        .executeTakeFirst()
      return Number(row?.n ?? 0)
    } finally {
      await db.close()
    }
  }

  async function endedTurn(): Promise<{ id: string; turnId: string }> {
    const { id } = await t.api.createSession('shell')
    await t.api.send(id, 'echo hi')
    const turns = (await t.api.call('GET', `/v1/sessions/${id}/turns`)).body.data as { id: string }[]
    const turnId = turns[0]?.id ?? ''
    expect(await storedEvents([turnId])).toBeGreaterThan(0)
    return { id, turnId }
  }

  it('a deleted session leaves no stored events', async () => {
    const { id, turnId } = await endedTurn()
    expect((await t.api.call('DELETE', `/v1/sessions/${id}`)).status).toBeLessThan(300)
    expect(await storedEvents([turnId])).toBe(0)
  })

  it('a retention pass deletes the events of turns that ended over a day ago, keeps recent ones; a late resume gets the end', async () => {
    const old = await endedTurn()
    const recent = await endedTurn()
    const db = await openDatabase((await testDatabaseFor(t.dataDir)) ?? path.join(t.dataDir, 'cairn.db'))
    try {
      const twoDaysAgo = new Date(Date.now() - 2 * 24 * 60 * 60 * 1000).toISOString()
      await db.kysely
        .updateTable('turns')
        .set({ ended_at: twoDaysAgo })
        .where('id', '=', old.turnId)
        .execute()
    } finally {
      await db.close()
    }
    await t.server.retention.apply()
    expect(await storedEvents([old.turnId])).toBe(0)
    expect(await storedEvents([recent.turnId])).toBeGreaterThan(0)
    // A resume after the window is answered from the turn's row: its end, then the stream closes.
    const res = await resume(old.id, old.turnId, { 'last-event-id': '2' })
    expect(res.status).toBe(200)
    const { messages, ended } = await readEvents(res)
    expect(ended).toBe(true)
    expect(messages.map((m) => m.event)).toEqual(['run.completed'])
  })
})

describe('a turn of more events than a resumed stream reads at once', () => {
  it('resumes whole, in order, while it runs and after it ended (the events are read a page at a time)', async () => {
    const frames = {
      'cairn.yaml': 'name: chatty\ncommand: python3 chatty.py\nprotocol: jsonl\n',
      'chatty.py': [
        'import json, sys, time',
        'def send(frame):',
        '    sys.stdout.write(json.dumps(frame) + "\\n")',
        '    sys.stdout.flush()',
        'for line in sys.stdin:',
        '    for i in range(1300):',
        '        send({"type": "status", "message": "step %d" % i})',
        '    time.sleep(1.5)',
        '    send({"type": "status", "message": "last"})',
        '    send({"type": "turn.done"})',
      ].join('\n'),
    }
    const deployed = await t.api.call(
      'POST',
      '/v1/agents?wait=true',
      await packDir(await makeProject(frames)),
    )
    expect(deployed.body.revision.status).toBe('READY')
    const { id } = await t.api.createSession('chatty')
    const controller = new AbortController()
    const res = await post(id, 'go', controller)
    const turnId = res.headers.get('cairn-turn-id') ?? ''
    // Hung up once the first burst is in: the turn sleeps before its end.
    await readEvents(res, controller, (m) => m.event === 'status' && m.data.includes('step 1299'))
    const expectWhole = (messages: { id?: string | undefined; event: string }[]) => {
      expect(idsOf(messages)).toEqual(messages.map((_, i) => i + 1))
      expect(messages.length).toBe(1303)
      expect(messages.at(-1)?.event).toBe('run.completed')
    }
    const live = await readEvents(await resume(id, turnId, {}, '?after=0'))
    expect(live.ended).toBe(true)
    expectWhole(live.messages)
    await waitForTurnEnd(id)
    expectWhole((await readEvents(await resume(id, turnId, {}, '?after=0'))).messages)
  })
})
