import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  for (const name of ['echo', 'notes', 'node-readline', 'jsonl-tools']) {
    const res = await t.api.deploy(`${EXAMPLES}/${name}`)
    expect(res.status).toBe(201)
  }
})

afterAll(async () => {
  await t?.close()
})

describe('an agent deployed and a session answered', () => {
  it('deploys the notes example as a READY revision with a content hash', async () => {
    const res = await t.api.call('GET', '/v1/agents/notes')
    expect(res.status).toBe(200)
    expect(res.body.name).toBe('notes')
    expect(res.body.revisions[0].status).toBe('READY')
    expect(res.body.revisions[0].contentHash).toMatch(/^sha256:[0-9a-f]{64}$/)
    expect(res.body.command).toEqual(['python3', 'notes.py'])
  })

  it('tells the notes agent a fact in turn 1 and it recalls it from its workspace in turn 2', async () => {
    const session = await t.api.createSession('notes')
    const first = await t.api.send(session.id, 'My cat is called Miso')
    expect(first.terminal?.type).toBe('run.completed')
    expect(first.text).toContain('Noted: My cat is called Miso')
    const second = await t.api.send(session.id, 'What is my cat called?')
    expect(second.text).toContain('- My cat is called Miso')
    const events = second.events.map((e) => e.type)
    expect(events[0]).toBe('run.started')
    expect(events).toContain('message.delta')
    expect(events.at(-1)).toBe('run.completed')

    const info = await t.api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body).toMatchObject({
      status: 'idle',
      turnCount: 2,
      messageCount: 4,
      title: 'My cat is called Miso',
    })
    const transcript = await t.api.call('GET', `/v1/sessions/${session.id}/messages`)
    expect(transcript.body.data.map((m: { role: string }) => m.role)).toEqual([
      'user',
      'assistant',
      'user',
      'assistant',
    ])
    expect(transcript.body.data[3].content).toContain('My cat is called Miso')
  })

  it('runs the node readline and jsonl examples', async () => {
    const node = await t.api.createSession('node-readline')
    await t.api.send(node.id, 'one')
    const two = await t.api.send(node.id, 'two')
    expect(two.text).toBe('You said "two". That is message 2 in this workspace.\n')

    const jsonl = await t.api.createSession('jsonl-tools')
    const run = await t.api.send(jsonl.id, 'hello\nworld')
    const types = run.events.map((e) => e.type)
    expect(types).toEqual(expect.arrayContaining(['status', 'tool.start', 'tool.end', 'run.completed']))
    expect(run.text).toContain('You said: hello\nworld')
  })

  it('keeps a file written in turn 1 through turn 5, and across a fresh sandbox after keep-warm', async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: files\ncommand: bash agent.sh\n',
      'agent.sh': [
        'while IFS= read -r line; do',
        '  case "$line" in',
        '    write*) echo "${line#write }" > kept.txt; echo written;;',
        '    read) cat kept.txt;;',
        // pid namespace inodes can be recycled once freed; the start time of the namespace's
        // init (pid 1, in clock ticks since boot) tells one sandbox from the next.
        '    pidns) echo "$(readlink /proc/self/ns/pid) init-started-at $(cut -d" " -f22 /proc/1/stat)";;',
        '    *) echo "turn $line";;',
        '  esac',
        'done',
      ].join('\n'),
    })
    expect((await t.api.deploy(project)).status).toBe(201)
    const session = await t.api.createSession('files', { keepWarmMs: 300 })
    await t.api.send(session.id, 'write persistent-value')
    const pidnsBefore = (await t.api.send(session.id, 'pidns')).text
    for (const n of [3, 4]) expect((await t.api.send(session.id, String(n))).text).toBe(`turn ${n}\n`)
    const fifth = await t.api.send(session.id, 'read')
    expect(fifth.text).toBe('persistent-value\n')
    const warmStart = fifth.events.find((e) => e.type === 'run.started')
    expect(warmStart).toMatchObject({ coldStart: false })

    // Past the keep-warm window the sandbox is stopped; the next turn runs in a new one.
    await new Promise((r) => setTimeout(r, 900))
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body.warm).toBe(false)
    const cold = await t.api.send(session.id, 'read')
    expect(cold.text).toBe('persistent-value\n')
    expect(cold.events.find((e) => e.type === 'run.started')).toMatchObject({ coldStart: true })
    const pidnsAfter = (await t.api.send(session.id, 'pidns')).text
    expect(pidnsAfter).not.toBe(pidnsBefore)
  })

  it('keeps sessions apart: one session cannot see another session workspace', async () => {
    const a = await t.api.createSession('files')
    const b = await t.api.createSession('files')
    await t.api.send(a.id, 'write only-in-a')
    const fromB = await t.api.send(b.id, 'read')
    expect(fromB.text).not.toContain('only-in-a')
  })

  it('lists, filters, paginates and resolves prefixes', async () => {
    const created: string[] = []
    for (let i = 0; i < 5; i++) created.push((await t.api.createSession('echo')).id)
    const page1 = await t.api.call('GET', '/v1/sessions?agent=echo&limit=3')
    expect(page1.body.data).toHaveLength(3)
    expect(page1.body.nextCursor).toBeTruthy()
    const page2 = await t.api.call('GET', `/v1/sessions?agent=echo&limit=3&cursor=${page1.body.nextCursor}`)
    const ids = [...page1.body.data, ...page2.body.data].map((s: { id: string }) => s.id)
    expect(new Set(ids).size).toBe(ids.length)
    for (const id of created) expect(ids).toContain(id)
    const idle = await t.api.call('GET', '/v1/sessions?status=completed')
    expect(idle.body.data.every((s: { status: string }) => s.status === 'completed')).toBe(true)

    const target = created[0] as string
    const unique = await t.api.call('GET', `/v1/sessions/resolve?prefix=${target.slice(0, 16)}`)
    expect(unique.body.id).toBe(target)
    const bare = await t.api.call('GET', `/v1/sessions/resolve?prefix=${target.slice(4, 14)}`)
    expect(bare.body.id).toBe(target)
    const ambiguous = await t.api.call('GET', '/v1/sessions/resolve?prefix=ses_')
    expect(ambiguous.status).toBe(409)
    expect(ambiguous.body.error.code).toBe('ambiguous_id')
    expect(ambiguous.body.error.message).toMatch(/^Ambiguous ID 'ses_' — matches: ses_/)
    const missing = await t.api.call('GET', '/v1/sessions/resolve?prefix=zzzzzzzz')
    expect(missing.status).toBe(404)
    expect(missing.body.error.message).toBe("No session found matching 'zzzzzzzz'")
  })

  it('ends, resumes and deletes a session, recording every transition with its cause', async () => {
    const session = await t.api.createSession('echo')
    await t.api.send(session.id, 'hello')
    expect((await t.api.call('POST', `/v1/sessions/${session.id}/end`)).body.status).toBe('completed')
    expect((await t.api.call('POST', `/v1/sessions/${session.id}/resume`)).body.status).toBe('idle')
    expect((await t.api.send(session.id, 'again')).text).toBe('again\n')
    expect((await t.api.call('DELETE', `/v1/sessions/${session.id}`)).body).toEqual({ ok: true })
    const after = await t.api.send(session.id, 'gone?')
    expect(after.status).toBe(410)
    const events = await t.api.call('GET', `/v1/sessions/${session.id}/events`)
    const causes = events.body.data.map((e: { cause: string }) => e.cause)
    expect(causes).toEqual([
      'created',
      'turn_started',
      'turn_completed',
      'user_end',
      'user_resume',
      'turn_started',
      'turn_completed',
      'user_delete',
    ])
  })

  it('times out idle sessions with cause idle_timeout', async () => {
    const session = await t.api.createSession('echo', { idleTimeoutMs: 1000 })
    await t.api.send(session.id, 'hello')
    await new Promise((r) => setTimeout(r, 1100))
    await t.server.sessions.reap()
    const info = await t.api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body).toMatchObject({ status: 'timeout', statusCause: 'idle_timeout', warm: false })
    expect((await t.api.send(session.id, 'back')).text).toBe('back\n')
  })

  it('exposes Prometheus metrics without a key', async () => {
    const res = await fetch(`${t.url}/metrics`)
    expect(res.headers.get('content-type')).toContain('text/plain')
    const text = await res.text()
    expect(text).toMatch(/^cairn_turns_total\{outcome="completed"\} \d+$/m)
    expect(text).toMatch(/^cairn_sessions\{status="idle"\} \d+$/m)
    expect(text).toContain('cairn_turn_duration_seconds_bucket{le="+Inf"}')
    expect(text).toMatch(/^cairn_sandboxes_warm \d+$/m)
  })
})
