import { isErrorCode } from '@cairn/protocol'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { FILE_TOOLS_AGENT } from '../helpers/protocol-server.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'

// The session's new surfaces (A2A, AG-UI, merging a fork back) attacked from outside, against one
// real server: tenant B's key, a read-only key, wrong JSON types and ids of other sessions.
// About 25 s: a second server (a sandbox cap of 1, for the refused A2A message), 60 property
// runs of A2A calls, and turns the agent sleeps in while a client drops its stream.
let t: TestServer
let b: Api
let readKey = ''
/** Tenant A: a file-tools session with one turn, a shell parent and its fork. */
const a = { session: '', turn: '', parent: '', fork: '', snapshot: '' }
/** Tenant B: its own shell parent and fork. */
const own = { parent: '', fork: '' }

async function forkOf(api: Api): Promise<{ parent: string; fork: string; snapshot: string }> {
  const parent = (await api.createSession('shell')).id
  const snapshot = (await api.call('POST', `/v1/sessions/${parent}/snapshots`, {})).body.id
  const forked = await api.call('POST', `/v1/sessions/${parent}/fork`, { snapshotId: snapshot })
  expect(forked.status, JSON.stringify(forked.body)).toBe(201)
  return { parent, fork: forked.body.id, snapshot }
}

beforeAll(async () => {
  t = await startTestServer({ server: { rateLimitPerSecond: 0 } })
  const shell = await makeProject(SHELL_PROJECT)
  for (const dir of [FILE_TOOLS_AGENT, shell]) expect((await t.api.deploy(dir)).status).toBe(201)
  const made = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b', role: 'admin' })
  b = new Api(t.url, made.body.key)
  for (const dir of [FILE_TOOLS_AGENT, shell]) expect((await b.deploy(dir)).status).toBe(201)
  readKey = (await t.api.call('POST', '/v1/keys', { name: 'reader', role: 'read' })).body.key
  a.session = (await t.api.createSession('file-tools')).id
  await t.api.send(a.session, 'write a.txt hello')
  a.turn = (await t.api.call('GET', `/v1/sessions/${a.session}/turns`)).body.data[0].id
  Object.assign(a, await forkOf(t.api))
  Object.assign(own, await forkOf(b))
}, 120_000)

afterAll(async () => {
  await t?.close()
})

const a2a = (api: Api, body: unknown, agent = 'file-tools') =>
  api.call('POST', `/v1/agents/${agent}/a2a`, body, { 'a2a-version': '1.0' })
const rpc = (method: string, params: unknown) => ({ jsonrpc: '2.0', id: 1, method, params })
const text = (value: unknown, contextId?: string) => ({
  message: {
    messageId: 'm1',
    role: 'ROLE_USER',
    parts: [{ text: value }],
    ...(contextId ? { contextId } : {}),
  },
})

describe('A2A from outside', () => {
  it("tenant B reaches none of A's tasks or contexts", async () => {
    for (const method of ['GetTask', 'CancelTask', 'SubscribeToTask']) {
      const res = await a2a(b, rpc(method, { id: a.turn }))
      expect(res.status, method).toBe(200)
      expect(res.body.error?.code, `${method}: ${JSON.stringify(res.body)}`).toBe(-32001)
    }
    const res = await a2a(b, rpc('SendMessage', text('read a.txt', a.session)))
    expect(res.body.error?.data?.[0]?.metadata?.code, JSON.stringify(res.body)).toBe('session_not_found')
    const card = await b.call(
      'GET',
      `/v1/agents/${(await t.api.call('GET', '/v1/agents/file-tools')).body.id}/a2a/.well-known/agent-card.json`,
    )
    expect(card.status).toBe(404)
  })

  it("answers a method named like an object's own property as an unknown method, in both dialects", async () => {
    for (const method of ['constructor', '__proto__', 'toString', 'hasOwnProperty'])
      for (const headers of [{ 'a2a-version': '1.0' }, {}]) {
        const res = await t.api.call(
          'POST',
          '/v1/agents/file-tools/a2a',
          rpc(method, { id: a.turn }),
          headers,
        )
        expect(res.status, `${method} ${JSON.stringify(res.body)}`).toBe(200)
        expect(res.body.error?.code, method).toBe(-32601)
      }
  })

  it('answers params with any JSON at any place with a typed JSON-RPC error or a task, never a fault (property)', async () => {
    const valid = (method: string) =>
      method.startsWith('Send') || method.startsWith('message/')
        ? { message: { messageId: 'm1', role: 'ROLE_USER', parts: [{ text: 'hi' }] } }
        : { id: a.turn }
    const methods = ['SendMessage', 'GetTask', 'CancelTask', 'SubscribeToTask', 'message/send', 'tasks/get']
    // A path into the valid params (existing or new keys, array indexes) and what to put there.
    const place = fc.array(
      fc.oneof(
        fc.constantFrom(
          'message',
          'parts',
          0,
          'text',
          'id',
          'contextId',
          'role',
          'configuration',
          'returnImmediately',
          'metadata',
        ),
        fc.string({ maxLength: 8 }),
      ),
      { minLength: 1, maxLength: 4 },
    )
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...methods),
        place,
        fc.jsonValue({ maxDepth: 2 }),
        async (method, path, value) => {
          const params: Record<string, unknown> = structuredClone(valid(method))
          let at: Record<string | number, unknown> = params
          for (const key of path.slice(0, -1)) {
            if (at[key] === null || typeof at[key] !== 'object') at[key] = {}
            at = at[key] as typeof at
          }
          at[path.at(-1) as string | number] = value
          const legacy = method.includes('/')
          const res = await t.api.call(
            'POST',
            '/v1/agents/file-tools/a2a',
            rpc(method, params),
            legacy ? {} : { 'a2a-version': '1.0' },
          )
          const what = `${method} ${JSON.stringify(params).slice(0, 300)} → ${res.status} ${JSON.stringify(res.body).slice(0, 300)}`
          if (res.status !== 200) {
            expect(res.status, what).toBeLessThan(500)
            expect(isErrorCode(res.body.error?.code), what).toBe(true)
            return
          }
          if (typeof res.body === 'string') return // a stream, begun: a valid streaming call
          if (res.body.error === undefined) return
          expect(res.body.error.code, what).not.toBe(-32603)
          const code = res.body.error.data?.[0]?.metadata?.code
          if (code !== undefined) expect(isErrorCode(code), what).toBe(true)
        },
      ),
      { numRuns: Number(process.env.PROPERTY_RUNS ?? 60) },
    )
  })

  it('a read-only key writes nothing', async () => {
    const reader = new Api(t.url, readKey)
    for (const method of ['SendMessage', 'SendStreamingMessage', 'CancelTask']) {
      const res = await a2a(reader, rpc(method, method === 'CancelTask' ? { id: a.turn } : text('hi')))
      expect(res.status, method).toBe(403)
    }
  })

  it('refuses wrong types naming the field, coercing nothing', async () => {
    for (const [params, where] of [
      [text(5), '/message/parts/0/text'],
      [text(null), '/message/parts/0/text'],
      [{ message: null }, '/message'],
      [{ ...text('hi'), configuration: { returnImmediately: 'true' } }, '/configuration/returnImmediately'],
      [{ message: { ...text('hi').message, contextId: 7 } }, '/message/contextId'],
    ] as const) {
      const res = await a2a(t.api, rpc('SendMessage', params))
      expect(res.body.error?.code, JSON.stringify(params)).toBe(-32602)
      expect(res.body.error?.message).toContain(where)
    }
    for (const body of [
      { ...rpc('GetTask', { id: a.turn }), id: {} },
      { ...rpc('GetTask', { id: a.turn }), params: null },
      { ...rpc('GetTask', { id: a.turn }), jsonrpc: 2 },
      { ...rpc('GetTask', { id: a.turn }), extra: 1 },
    ]) {
      const res = await a2a(t.api, body)
      expect(res.status, JSON.stringify(body)).toBe(400)
      expect(res.body.error.code).toBe('validation_failed')
    }
    const res = await a2a(t.api, rpc('GetTask', { id: 12 }))
    expect(res.body.error?.code).toBe(-32602)
  })

  it('a context of another agent, a deleted or an ended session is refused, and leaves no session behind', async () => {
    const shell = (await t.api.createSession('shell')).id
    const gone = (await t.api.createSession('file-tools')).id
    expect((await t.api.call('DELETE', `/v1/sessions/${gone}`)).status).toBe(200)
    const before = (await t.api.call('GET', '/v1/sessions?limit=200')).body.data.length
    for (const ctx of [shell, gone, 'ses_nope']) {
      const res = await a2a(t.api, rpc('SendMessage', text('hi', ctx)))
      expect(res.body.error?.code, JSON.stringify(res.body)).toBe(-32602)
    }
    expect((await t.api.call('GET', '/v1/sessions?limit=200')).body.data.length).toBe(before)
  })
})

const agUi = (api: Api, body: unknown, agent = 'file-tools') =>
  fetch(`${t.url}/v1/agents/${agent}/ag-ui`, {
    method: 'POST',
    headers: { authorization: `Bearer ${api.key}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  })
const run = (threadId: unknown, content: unknown = 'read a.txt') => ({
  threadId,
  runId: 'r1',
  messages: [{ id: 'm1', role: 'user', content }],
})

describe('AG-UI from outside', () => {
  it("tenant B reaches none of A's sessions as threads", async () => {
    const res = await agUi(b, run(a.session))
    expect(res.status).toBe(404)
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('session_not_found')
  })

  it('a read-only key runs nothing', async () => {
    expect((await agUi(new Api(t.url, readKey), run('thread-r'))).status).toBe(403)
  })

  it('refuses wrong types naming the field', async () => {
    for (const [body, where] of [
      [run(5), 'threadId'],
      [run(null), 'threadId'],
      [run('t-1', 5), 'content'],
      [run('t-1', [{ type: 'text', text: 5 }]), 'text'],
      [{ ...run('t-1'), messages: null }, 'messages'],
      [{ ...run('t-1'), runId: 'x'.repeat(201) }, 'runId'],
    ] as const) {
      const res = await agUi(t.api, body)
      expect(res.status, JSON.stringify(body).slice(0, 200)).toBe(400)
      const answer = (await res.json()) as { error: { code: string; message: string } }
      expect(answer.error.code).toBe('validation_failed')
      expect(answer.error.message).toContain(where)
    }
  })

  it('a thread of a deleted session is 410, of another agent 400', async () => {
    const gone = (await t.api.createSession('file-tools')).id
    expect((await t.api.call('DELETE', `/v1/sessions/${gone}`)).status).toBe(200)
    expect((await agUi(t.api, run(gone))).status).toBe(410)
    const shell = (await t.api.createSession('shell')).id
    expect((await agUi(t.api, run(shell))).status).toBe(400)
  })
})

describe('commands from outside', () => {
  it("tenant B names A's command under its own session: not found, and the command untouched", async () => {
    const started = await t.api.call('POST', `/v1/sessions/${a.parent}/commands`, {
      command: ['cat'],
      stdin: true,
    })
    expect(started.status, JSON.stringify(started.body)).toBe(201)
    const cmd = started.body.id as string
    for (const session of [own.parent, a.parent]) {
      const base = `/v1/sessions/${session}/commands/${cmd}`
      expect((await b.call('GET', base)).status).toBe(404)
      expect((await b.call('GET', `${base}/output?follow=false`)).status).toBe(404)
      expect((await b.call('POST', `${base}/stdin`, { text: 'B was here', close: true })).status).toBe(404)
      expect((await b.call('POST', `${base}/signal`, { signal: 'SIGKILL' })).status).toBe(404)
    }
    expect((await b.call('GET', `/v1/sessions/${own.parent}/commands`)).body.data).toEqual([])
    const still = await t.api.call('GET', `/v1/sessions/${a.parent}/commands/${cmd}`)
    expect(still.body).toMatchObject({ status: 'running', outputBytes: 0 })
    const wrong = await t.api.call('POST', `/v1/sessions/${a.parent}/commands`, { command: 'cat' })
    expect(wrong.status).toBe(400)
    expect(wrong.body.error.message).toContain('command')
    expect(
      (await t.api.call('POST', `/v1/sessions/${a.parent}/commands/${cmd}/signal`, { signal: 'SIGKILL' }))
        .status,
    ).toBe(200)
  })
})

describe('a client that drops mid-stream', () => {
  /** Opens a stream, reads its first bytes, drops it; answers the session the stream named. */
  async function dropAfterFirst(url: string, body: unknown, headers: Record<string, string> = {}) {
    const abort = new AbortController()
    const res = await fetch(url, {
      method: 'POST',
      signal: abort.signal,
      headers: { authorization: `Bearer ${t.key}`, 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
    })
    expect(res.headers.get('content-type')).toContain('text/event-stream')
    const first = await res.body?.getReader().read()
    abort.abort()
    return Buffer.from(first?.value ?? []).toString('utf8')
  }

  /** The session's last turn once it ended (polled: the turn runs on after the drop). */
  async function lastTurnEnded(session: string) {
    for (let i = 0; i < 300; i++) {
      const turns = (await t.api.call('GET', `/v1/sessions/${session}/turns`)).body.data as {
        status: string
      }[]
      const last = turns.at(-1)
      if (last && last.status !== 'running') return last
      await new Promise((r) => setTimeout(r, 100))
    }
    throw new Error(`the turn of ${session} did not end`)
  }

  it('AG-UI and A2A: the turn runs to its own end, and the session takes the next message', async () => {
    const thread = (await t.api.createSession('file-tools')).id
    await dropAfterFirst(`${t.url}/v1/agents/file-tools/ag-ui`, run(thread, 'sleep 1'))
    expect((await lastTurnEnded(thread)).status).toBe('completed')
    expect((await t.api.send(thread, 'read a.txt')).status).toBe(200)
    const context = (await t.api.createSession('file-tools')).id
    const first = await dropAfterFirst(
      `${t.url}/v1/agents/file-tools/a2a`,
      rpc('SendStreamingMessage', text('sleep 1', context)),
      { 'a2a-version': '1.0' },
    )
    expect(first).toContain('TASK_STATE_WORKING')
    expect((await lastTurnEnded(context)).status).toBe('completed')
    expect((await t.api.send(context, 'read a.txt')).status).toBe(200)
  })
})

describe('merging from outside', () => {
  const merge = (api: Api, id: string, body: unknown) => api.call('POST', `/v1/sessions/${id}/merge`, body)

  it("tenant B neither merges A's fork nor merges into A's sessions", async () => {
    expect((await merge(b, a.fork, {})).status).toBe(404)
    expect((await merge(b, a.fork, { preview: true })).status).toBe(404)
    expect((await merge(b, own.fork, { into: a.parent })).status).toBe(404)
    expect((await merge(b, own.fork, { into: a.parent, preview: true })).status).toBe(404)
    expect((await merge(b, own.fork, { snapshotId: a.snapshot })).status).toBe(404)
  })

  it('a read-only key previews but does not merge', async () => {
    const reader = new Api(t.url, readKey)
    expect((await merge(reader, a.fork, {})).status).toBe(403)
    expect((await merge(reader, a.fork, { preview: true })).status).toBe(200)
  })

  it("writes nothing through links: the fork's links, a directory it made a link, a target's link over a directory", async () => {
    const mark = `pwned-${process.pid}-${Date.now()}`
    const parent = (await t.api.createSession('shell')).id
    expect(
      (await t.api.send(parent, 'mkdir -p keep tgt && echo base > keep/a.txt && echo base > tgt/b.txt')).text,
    ).toContain('[exit 0]')
    const point = (await t.api.call('POST', `/v1/sessions/${parent}/snapshots`, {})).body.id
    const fork = (await t.api.call('POST', `/v1/sessions/${parent}/fork`, { snapshotId: point })).body.id
    const inFork = [
      'ln -s /etc evil',
      'ln -s ../../../.. up',
      'rm -r keep && ln -s /tmp keep',
      `echo fork > tgt/${mark}`,
      'echo fork > tgt/b.txt',
    ].join(' && ')
    expect((await t.api.send(fork, inFork)).text).toContain('[exit 0]')
    // The target makes tgt a link to the sandbox's /tmp (the host's /tmp, were it followed host-side).
    expect((await t.api.send(parent, 'rm -r tgt && ln -s /tmp tgt')).text).toContain('[exit 0]')
    const res = await merge(t.api, fork, {})
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    const conflicts = new Map(
      (res.body.conflicts as { path: string; kind: string }[]).map((c) => [c.path, c.kind]),
    )
    for (const path of ['evil', 'up', 'keep']) expect(conflicts.get(path), path).toBe('unsupported')
    for (const path of [`tgt/${mark}`, 'tgt/b.txt']) expect(conflicts.get(path), path).toBe('type')
    expect(res.body.changes).toEqual([])
    const host = await import('node:fs')
    expect(host.existsSync(`/tmp/${mark}`)).toBe(false)
    const listed = (await t.api.send(parent, `ls -la /tmp/${mark} keep/a.txt; readlink tgt`)).text
    expect(listed).toContain('keep/a.txt')
    expect(listed).toContain('No such file')
  })

  it('refuses wrong types naming the field', async () => {
    for (const [body, where] of [
      [{ preview: 'true' }, 'preview'],
      [{ preview: null }, 'preview'],
      [{ into: 5 }, 'into'],
      [{ strategy: null }, 'strategy'],
      [{ snapshotId: 5 }, 'snapshotId'],
      [{ extra: 1 }, 'extra'],
      [null, 'body'],
    ] as const) {
      const res = await merge(t.api, a.fork, body)
      expect(res.status, JSON.stringify(body)).toBe(400)
      expect(res.body.error.code).toBe('validation_failed')
      expect(res.body.error.message.toLowerCase()).toContain(where.toLowerCase())
    }
  })
})

describe('A2A under the sandbox cap', () => {
  let capped: TestServer
  beforeAll(async () => {
    capped = await startTestServer({
      server: { operatorLimits: { maxSandboxesPerTenant: 1, sandboxWaitMs: 0 } },
    })
    expect((await capped.api.deploy(FILE_TOOLS_AGENT)).status).toBe(201)
  }, 60_000)
  afterAll(async () => {
    await capped?.close()
  })

  it('a message without a context that cannot begin leaves no session behind', async () => {
    const busy = (await capped.api.createSession('file-tools')).id
    const sleeping = capped.api.send(busy, 'sleep 30')
    for (let i = 0; i < 200; i++) {
      if ((await capped.api.call('GET', `/v1/sessions/${busy}`)).body.status === 'active') break
      await new Promise((r) => setTimeout(r, 100))
    }
    const count = async () => (await capped.api.call('GET', '/v1/sessions?limit=200')).body.data.length
    const before = await count()
    for (let i = 0; i < 3; i++) {
      const res = await a2a(capped.api, rpc('SendMessage', text('hello')))
      expect(res.body.error?.data?.[0]?.metadata?.code, JSON.stringify(res.body)).toBe(
        'sandbox_limit_reached',
      )
    }
    expect(await count()).toBe(before)
    expect((await capped.api.call('POST', `/v1/sessions/${busy}/cancel`)).status).toBe(200)
    await sleeping
  })
})

describe('MCP from outside', () => {
  const mcp = (body: unknown) =>
    t.api.call('POST', '/v1/mcp', body, {
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': '2025-03-26',
    })
  const create = (id: number) => ({
    jsonrpc: '2.0',
    id,
    method: 'tools/call',
    params: { name: 'create_session', arguments: { agent: 'file-tools' } },
  })

  it('a JSON-RPC batch is refused whole: one request cannot carry many tool calls past the rate limit', async () => {
    const count = async () => (await t.api.call('GET', '/v1/sessions?limit=500')).body.data.length
    const before = await count()
    const res = await mcp(Array.from({ length: 20 }, (_, i) => create(i + 1)))
    expect(res.status, JSON.stringify(res.body).slice(0, 300)).toBe(400)
    expect(res.body.error.code).toBe('validation_failed')
    expect(await count()).toBe(before)
    expect((await mcp(create(1))).status).toBe(200)
  })
})
