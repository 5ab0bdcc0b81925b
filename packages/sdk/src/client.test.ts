import { encodeSse, type StreamEvent } from '@cairn/protocol'
import { describe, expect, it } from 'vitest'
import { Cairn } from './client.js'
import {
  AbortError,
  AmbiguousIdError,
  AuthenticationError,
  type CairnError,
  ConnectionError,
  InvalidResponseError,
  NotFoundError,
  SessionBusyError,
  SessionNotFoundError,
  TimeoutError,
} from './errors.js'

const SESSION = {
  id: 'ses_aaaaaaaaaaaaaaaaaaaa',
  agentId: 'agt_bbbbbbbbbbbbbbbbbbbb',
  agentName: 'echo',
  revisionId: 'rev_cccccccccccccccccccc',
  title: null,
  status: 'idle',
  statusCause: 'created',
  turnCount: 0,
  messageCount: 0,
  idleTimeoutMs: 1000,
  keepWarmMs: 1000,
  policy: {
    idleTimeoutMs: 1000,
    keepWarmMs: 1000,
    maxTurns: null,
    maxDurationMs: null,
    onTimeout: 'keep',
    approvalTimeoutMs: null,
  },
  deadlineAt: null,
  generation: 1,
  autoSnapshots: true,
  pause: null,
  ephemeral: false,
  warm: false,
  approvalId: null,
  createdAt: '2026-01-01T00:00:00.000Z',
  updatedAt: '2026-01-01T00:00:00.000Z',
  lastActiveAt: '2026-01-01T00:00:00.000Z',
}

const started: StreamEvent = {
  type: 'run.started',
  sessionId: SESSION.id,
  turnId: 'trn_1',
  turn: 1,
  sandboxId: 'sbx_1',
  coldStart: true,
}

type Handler = (url: URL, init: RequestInit) => Response | Promise<Response>

function client(handler: Handler, calls: string[] = []) {
  return new Cairn({
    apiKey: 'k',
    baseUrl: 'http://cairn.test/',
    fetch: async (input, init) => {
      const url = new URL(input)
      calls.push(`${init.method} ${url.pathname}${url.search}`)
      return handler(url, init)
    },
  })
}

const json = (body: unknown, status = 200) =>
  new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } })

/** An SSE answer; with `ids`, the events are numbered from it. */
function sse(
  events: StreamEvent[],
  { hold = false, signal, ids }: { hold?: boolean; signal?: AbortSignal | null; ids?: number } = {},
) {
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const [i, e] of events.entries())
        controller.enqueue(new TextEncoder().encode(encodeSse(e, ids === undefined ? undefined : ids + i)))
      if (!hold) controller.close()
      signal?.addEventListener('abort', () => controller.error(new DOMException('aborted', 'AbortError')))
    },
  })
  return new Response(body, { headers: { 'content-type': 'text/event-stream' } })
}

describe('Cairn client', () => {
  it('sends the key and decodes sessions', async () => {
    let auth: string | null = null
    const c = client((_url, init) => {
      auth = new Headers(init.headers).get('authorization')
      return json(SESSION)
    })
    const session = await c.sessions.get(SESSION.id)
    expect(auth).toBe('Bearer k')
    expect(session.id).toBe(SESSION.id)
    expect(session.title).toBeUndefined()
  })

  it('maps error codes to classes', async () => {
    const c = client((url) => {
      if (url.pathname.endsWith('/resolve')) {
        return json(
          {
            error: {
              code: 'ambiguous_id',
              message: "Ambiguous ID 'a'",
              requestId: 'req_1',
              details: { matches: ['ses_a1', 'ses_a2'] },
            },
          },
          409,
        )
      }
      if (url.pathname === '/v1/agents')
        return json({ error: { code: 'unauthorized', message: 'no key' } }, 401)
      if (url.pathname.endsWith('/messages'))
        return json({ error: { code: 'session_busy', message: 'busy' } }, 409)
      if (url.pathname === '/v1/agents/x') return new Response('<html>not found</html>', { status: 404 })
      return json({ error: { code: 'session_not_found', message: "No session found matching 'zz'" } }, 404)
    })
    const ambiguous = await c.sessions.resolve('a').catch((e: unknown) => e)
    expect(ambiguous).toBeInstanceOf(AmbiguousIdError)
    expect(ambiguous).toMatchObject({
      code: 'ambiguous_id',
      status: 409,
      requestId: 'req_1',
      retryable: false,
    })
    expect((ambiguous as AmbiguousIdError).matches).toEqual(['ses_a1', 'ses_a2'])
    await expect(c.sessions.resolve('zz')).rejects.toBeInstanceOf(AmbiguousIdError)
    await expect(c.sessions.get('zz')).rejects.toBeInstanceOf(SessionNotFoundError)
    await expect(c.agents.list()).rejects.toBeInstanceOf(AuthenticationError)
    const html = await c.agents.get('x').catch((e: unknown) => e)
    expect(html).toBeInstanceOf(NotFoundError)
    expect(html).toMatchObject({ code: 'not_found', status: 404 })
    const busy = await c.sessions.stream(SESSION.id, 'hi').result.catch((e: unknown) => e)
    expect(busy).toBeInstanceOf(SessionBusyError)
    expect((busy as CairnError).retryable).toBe(true)
  })

  it('reports connection failures and timeouts', async () => {
    const refused = client(() => {
      throw new TypeError('fetch failed', { cause: { code: 'ECONNREFUSED' } })
    })
    const error = await refused.agents.list().catch((e: unknown) => e)
    expect(error).toBeInstanceOf(ConnectionError)
    expect((error as Error).message).toContain('ECONNREFUSED')
    const slow = new Cairn({
      baseUrl: 'http://cairn.test',
      timeoutMs: 20,
      fetch: (_input, init) =>
        new Promise((_resolve, reject) =>
          init.signal?.addEventListener('abort', () => reject(new Error('aborted'))),
        ),
    })
    await expect(slow.agents.list()).rejects.toBeInstanceOf(TimeoutError)
    const controller = new AbortController()
    const pending = slow.agents.list({ signal: controller.signal, timeoutMs: 0 })
    controller.abort()
    await expect(pending).rejects.toBeInstanceOf(AbortError)
  })

  it('streams a run: events, text and result', async () => {
    const c = client(() =>
      sse([
        started,
        { type: 'message.delta', turnId: 'trn_1', content: 'hel' },
        { type: 'tool.start', turnId: 'trn_1', toolCallId: 't1', name: 'ls', input: { dir: '.' } },
        { type: 'tool.end', turnId: 'trn_1', toolCallId: 't1', output: 'a b', durationMs: 3 },
        { type: 'message.delta', turnId: 'trn_1', content: 'lo' },
        { type: 'run.completed', turnId: 'trn_1', text: 'hello', durationMs: 12 },
      ]),
    )
    const stream = c.sessions.stream(SESSION.id, 'hi')
    const chunks: string[] = []
    for await (const chunk of stream.textStream) chunks.push(chunk)
    const types: string[] = []
    for await (const event of stream) types.push(event.type)
    expect(chunks).toEqual(['hel', 'lo'])
    expect(types).toEqual([
      'run.started',
      'message.delta',
      'tool.start',
      'tool.end',
      'message.delta',
      'run.completed',
    ])
    expect(await stream.result).toEqual({
      text: 'hello',
      toolCalls: [{ id: 't1', name: 'ls', input: { dir: '.' }, output: 'a b', durationMs: 3 }],
      finishReason: 'completed',
      durationMs: 12,
      sessionId: SESSION.id,
      turn: 1,
      turnId: 'trn_1',
    })
  })

  it('resolves a failed run with its error', async () => {
    const c = client(() =>
      sse([
        started,
        { type: 'message.delta', turnId: 'trn_1', content: 'part' },
        {
          type: 'run.failed',
          turnId: 'trn_1',
          durationMs: 5,
          error: { code: 'agent_crashed', message: 'exit 1' },
        },
      ]),
    )
    expect(await c.sessions.run(SESSION.id, 'hi')).toMatchObject({
      finishReason: 'failed',
      text: 'part',
      error: { code: 'agent_crashed', message: 'exit 1' },
    })
  })

  it('throws a connection error when the stream ends without a final event (reconnecting off)', async () => {
    const c = client(() => sse([started]))
    const stream = c.sessions.stream(SESSION.id, 'hi', { maxReconnects: 0 })
    await expect(stream.result).rejects.toBeInstanceOf(ConnectionError)
    const seen: string[] = []
    await expect(async () => {
      for await (const e of stream) seen.push(e.type)
    }).rejects.toBeInstanceOf(ConnectionError)
    expect(seen).toEqual(['run.started'])
  })

  it('picks a dropped stream up after the last event id, and says so', async () => {
    const delta = (content: string): StreamEvent => ({ type: 'message.delta', turnId: 'trn_1', content })
    const calls: string[] = []
    const c = client((url) => {
      if (url.pathname.endsWith('/messages')) return sse([started, delta('a'), delta('b')], { ids: 1 })
      return sse([delta('c'), { type: 'run.completed', turnId: 'trn_1', text: 'abc', durationMs: 3 }], {
        ids: 4,
      })
    }, calls)
    const told: { attempt: number; afterEventId: number }[] = []
    const stream = c.sessions.stream(SESSION.id, 'hi', {
      onReconnect: ({ attempt, afterEventId }) => told.push({ attempt, afterEventId }),
    })
    expect(await stream.result).toMatchObject({ finishReason: 'completed', text: 'abc' })
    const seen: string[] = []
    for await (const e of stream) seen.push(e.type === 'message.delta' ? e.content : e.type)
    expect(seen).toEqual(['run.started', 'a', 'b', 'c', 'run.completed'])
    expect(told).toEqual([{ attempt: 1, afterEventId: 3 }])
    expect(calls.at(-1)).toBe(`GET /v1/sessions/${SESSION.id}/turns/trn_1/events?after=3`)
    expect(stream.reconnects).toBe(1)
  })

  it('abort() while waiting to reconnect resolves cancelled without the try', async () => {
    const calls: string[] = []
    const c = client(
      (url) => (url.pathname.endsWith('/cancel') ? json({ ok: true }) : sse([started], { ids: 1 })),
      calls,
    )
    const stream = c.sessions.stream(SESSION.id, 'hi', {
      onReconnect: () => void stream.abort(),
    })
    expect(await stream.result).toMatchObject({ finishReason: 'cancelled' })
    expect(calls.filter((call) => call.includes('/turns/'))).toEqual([])
  })

  it('abort() cancels on the server and resolves cancelled', async () => {
    const calls: string[] = []
    let onCancel: () => void = () => undefined
    const c = client((url) => {
      if (url.pathname.endsWith('/cancel')) {
        onCancel()
        return json({ ok: true })
      }
      const body = new ReadableStream<Uint8Array>({
        start(controller) {
          const send = (e: StreamEvent) => controller.enqueue(new TextEncoder().encode(encodeSse(e)))
          send(started)
          send({ type: 'message.delta', turnId: 'trn_1', content: 'so far' })
          onCancel = () => {
            send({ type: 'run.cancelled', turnId: 'trn_1', durationMs: 9 })
            controller.close()
          }
        },
      })
      return new Response(body, { headers: { 'content-type': 'text/event-stream' } })
    }, calls)
    const stream = c.sessions.stream(SESSION.id, 'hi')
    for await (const event of stream) if (event.type === 'message.delta') break
    await stream.abort()
    expect(await stream.result).toMatchObject({
      finishReason: 'cancelled',
      text: 'so far',
      turn: 1,
      durationMs: 9,
    })
    expect(calls).toContain(`POST /v1/sessions/${SESSION.id}/cancel`)
    const types: string[] = []
    for await (const event of stream) types.push(event.type)
    expect(types).toEqual(['run.started', 'message.delta', 'run.cancelled'])
  })

  it('a signal aborts a stream the server never finishes', async () => {
    const c = client((url, init) => {
      if (url.pathname.endsWith('/cancel')) return json({ ok: false })
      return sse([started], { hold: true, signal: init.signal ?? null })
    })
    const controller = new AbortController()
    const stream = c.sessions.stream(SESSION.id, 'hi', { signal: controller.signal })
    for await (const event of stream) if (event.type === 'run.started') break
    controller.abort()
    const result = await stream.result
    expect(result.finishReason).toBe('cancelled')
  }, 10_000)

  it('run() without a session creates one and ends it', async () => {
    const calls: string[] = []
    const c = client((url) => {
      if (url.pathname === '/v1/sessions') return json(SESSION, 201)
      if (url.pathname.endsWith('/end')) return json({ ...SESSION, status: 'completed' })
      return sse([started, { type: 'run.completed', turnId: 'trn_1', text: 'ok', durationMs: 1 }])
    }, calls)
    const result = await c.run('echo', { message: 'hi' })
    expect(result.text).toBe('ok')
    expect(result.sessionId).toBe(SESSION.id)
    expect(calls).toEqual([
      'POST /v1/sessions',
      `POST /v1/sessions/${SESSION.id}/messages`,
      `POST /v1/sessions/${SESSION.id}/end`,
    ])
  })

  it('an already aborted signal resolves cancelled without a request', async () => {
    const calls: string[] = []
    const c = client(() => json({}), calls)
    const controller = new AbortController()
    controller.abort()
    const result = await c.run('echo', { message: 'hi', signal: controller.signal })
    expect(result.finishReason).toBe('cancelled')
    expect(calls).toEqual([])
  })

  it('sends autoSnapshots only when it is set, and leases a session', async () => {
    const bodies: unknown[] = []
    const calls: string[] = []
    const c = client(async (url, init) => {
      bodies.push(typeof init.body === 'string' ? JSON.parse(init.body) : undefined)
      if (url.pathname.endsWith('/lease'))
        return json({ sessionId: SESSION.id, leaseUntil: '2026-01-01T00:05:00.000Z', extra: 1 })
      return json({ ...SESSION, autoSnapshots: bodies.length === 1 }, 201)
    }, calls)
    expect((await c.createSession('echo')).info.autoSnapshots).toBe(true)
    const session = await c.createSession('echo', { autoSnapshots: false })
    expect(session.info.autoSnapshots).toBe(false)
    expect(await session.lease(300_000)).toEqual({
      sessionId: SESSION.id,
      leaseUntil: '2026-01-01T00:05:00.000Z',
    })
    expect(bodies).toEqual([{ agent: 'echo' }, { agent: 'echo', autoSnapshots: false }, { ttlMs: 300_000 }])
    expect(calls.at(-1)).toBe(`POST /v1/sessions/${SESSION.id}/lease`)
    const broken = client(() => json({ ok: true }))
    await expect(broken.sessions.lease(SESSION.id, 1000)).rejects.toBeInstanceOf(InvalidResponseError)
  })

  it('checks sessions against the protocol schema: a mismatch is an invalid_response error naming it', async () => {
    for (const bad of [
      { ...SESSION, status: 'sleeping' },
      { ...SESSION, turnCount: '3' },
      { ...SESSION, policy: { ...SESSION.policy, onTimeout: 'explode' } },
      (({ generation: _g, ...rest }) => rest)(SESSION),
    ]) {
      const c = client(() => json(bad))
      const error = await c.sessions.get(SESSION.id).catch((e: unknown) => e)
      expect(error).toBeInstanceOf(InvalidResponseError)
      expect(error).toMatchObject({
        code: 'invalid_response',
        message: expect.stringContaining('session: /'),
      })
    }
    const newer = client(() => json({ ...SESSION, fieldFromANewerServer: 1 }))
    expect((await newer.sessions.get(SESSION.id)).id).toBe(SESSION.id)
  })

  it('creates, lists and revokes API keys', async () => {
    const bodies: unknown[] = []
    const calls: string[] = []
    const key = {
      id: 'key_aaaaaaaaaaaaaaaaaaaa',
      prefix: 'cairn_sk_abcd',
      role: 'read',
      name: null,
      tenantId: 'tnt_default',
      createdAt: '2026-01-01T00:00:00.000Z',
      lastUsedAt: null,
      revokedAt: null,
    }
    const c = client((_url, init) => {
      bodies.push(typeof init.body === 'string' ? JSON.parse(init.body) : undefined)
      if (init.method === 'POST')
        return json({ id: key.id, key: 'cairn_sk_abcdefgh', tenantId: 'tnt_default', role: 'read' }, 201)
      if (init.method === 'DELETE') return json({ ok: true })
      return json({ data: [key] })
    }, calls)
    expect(await c.keys.create({ role: 'read', name: 'ci' })).toEqual({
      id: key.id,
      key: 'cairn_sk_abcdefgh',
      tenantId: 'tnt_default',
      role: 'read',
    })
    expect(await c.keys.list()).toEqual([key])
    await c.keys.revoke(key.id)
    expect(calls).toEqual(['POST /v1/keys', 'GET /v1/keys', `DELETE /v1/keys/${key.id}`])
    expect(bodies[0]).toEqual({ role: 'read', name: 'ci' })
    const broken = client(() => json({ data: [{ id: 1 }] }))
    await expect(broken.keys.list()).rejects.toBeInstanceOf(InvalidResponseError)
    await expect(broken.keys.create()).rejects.toBeInstanceOf(InvalidResponseError)
  })

  it('checks keys, secrets, build logs, leases, preview URLs and manifests against the protocol schemas', async () => {
    const agent = 'echo'
    const revision = 'rev_cccccccccccccccccccc'
    const key = {
      id: 'key_a',
      prefix: 'cairn_sk_ab',
      role: 'read',
      name: null,
      tenantId: 't',
      createdAt: 'x',
    }
    // Each answer is wrong where the former hand-written checks did not look.
    const cases: [string, unknown, (c: Cairn) => Promise<unknown>][] = [
      ['API key list', { data: [{ ...key, lastUsedAt: 7, revokedAt: null }] }, (c) => c.keys.list()],
      ['new API key', { id: 'key_a', key: 'cairn_sk_abcd', role: 'read' }, (c) => c.keys.create()],
      [
        'secret list',
        { data: [{ name: 'TOKEN', scope: 'runtime', createdAt: 'x', updatedAt: 'x' }] },
        (c) => c.secrets.list(agent),
      ],
      [
        'secret list',
        {
          data: [{ name: 'TOKEN', scope: 'proxy', hosts: [1], createdAt: 'x', updatedAt: 'x' }],
          missing: [],
        },
        (c) => c.secrets.list(agent),
      ],
      [
        'build log',
        { status: 'READY', error: null, lines: ['ok', 3] },
        (c) => c.agents.logs(agent, revision),
      ],
      ['build log', { status: 'READY', lines: [] }, (c) => c.agents.logs(agent, revision)],
      ['lease', { sessionId: SESSION.id, leaseUntil: null }, (c) => c.sessions.lease(SESSION.id, 1000)],
      [
        'preview URL',
        { url: 'https://p.test/', expiresAt: 5 },
        (c) => c.sessions.previewUrl(SESSION.id, 8080),
      ],
      ['manifest', { session: SESSION }, (c) => c.sessions.manifest(SESSION.id)],
    ]
    for (const [what, body, call] of cases) {
      const error = await call(client(() => json(body))).catch((e: unknown) => e)
      expect(error, `${what}: ${JSON.stringify(body)}`).toBeInstanceOf(InvalidResponseError)
      expect(error).toMatchObject({
        code: 'invalid_response',
        message: expect.stringContaining(`${what}: /`),
      })
    }
  })
})
