import { connect } from 'node:net'
import { gzipSync } from 'node:zlib'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { Api, EXAMPLES, startTestServer, type TestServer } from '../helpers/server.js'

let t: TestServer
let other: Api
let readOnly: Api
let sessionId = ''
let agentId = ''
let snapshotId = ''
let webhookId = ''
const COMPAT_PREFIX = '/compat'

beforeAll(async () => {
  // With the compat API on: its routes are in the document too, and swept like the native ones.
  t = await startTestServer({ server: { rateLimitPerSecond: 0, compatPrefix: COMPAT_PREFIX } })
  expect((await t.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
  agentId = (await t.api.call('GET', '/v1/agents/echo')).body.id
  sessionId = (await t.api.createSession('echo')).id
  await t.api.send(sessionId, 'tenant A secret conversation')
  snapshotId = (await t.api.call('POST', `/v1/sessions/${sessionId}/snapshots`, {})).body.id
  // A documentation address (public to the guard) and an event a single server never sends (a
  // node lost, in a cluster only): nothing is delivered.
  webhookId = (
    await t.api.call('POST', '/v1/webhooks', {
      url: 'https://203.0.113.10/hook',
      events: ['session.node_lost'],
    })
  ).body.id
  const b = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b', role: 'admin' })
  expect(b.status).toBe(201)
  other = new Api(t.url, b.body.key)
  const ro = await t.api.call('POST', '/v1/keys', { role: 'read', name: 'viewer' })
  readOnly = new Api(t.url, ro.body.key)
})

afterAll(async () => {
  await t?.close()
})

describe('tenants never meet', () => {
  it("refuses tenant B on every ID-taking route of tenant A's resources (table from the OpenAPI document)", async () => {
    const doc = (await fetch(`${t.url}/v1/openapi.json`).then((r) => r.json())) as {
      paths: Record<string, Record<string, unknown>>
    }
    const tried: string[] = []
    for (const [route, methods] of Object.entries(doc.paths)) {
      if (!route.includes('{id}')) continue
      const native = route.startsWith(COMPAT_PREFIX) ? route.slice(COMPAT_PREFIX.length) : route
      const id = native.startsWith('/v1/sessions')
        ? sessionId
        : native.startsWith('/v1/agents')
          ? agentId
          : native.startsWith('/v1/webhooks')
            ? webhookId
            : undefined
      if (!id) continue
      for (const method of Object.keys(methods)) {
        const url = route
          .replace('{id}', id)
          .replace('{rev}', 'rev_00000000000000000000')
          .replace('{name}', 'X')
          .replace('{port}', '8000')
          .replace('{key}', 'X')
        const withQuery = url.includes('/files') ? `${url}?path=README.md` : url
        const body = method === 'post' || method === 'put' || method === 'patch' ? bodyFor(url) : undefined
        const res = await other.call(method.toUpperCase(), withQuery, body)
        tried.push(`${method.toUpperCase()} ${route} -> ${res.status}`)
        expect(res.status, `${method.toUpperCase()} ${route}: ${JSON.stringify(res.body)}`).toBe(404)
      }
    }
    expect(tried.length).toBeGreaterThan(20)
    expect(tried.filter((line) => line.includes(` ${COMPAT_PREFIX}/`)).length).toBeGreaterThan(8)
    // Lists show nothing of tenant A.
    expect((await other.call('GET', '/v1/sessions')).body.data).toEqual([])
    expect((await other.call('GET', '/v1/agents')).body.data).toEqual([])
    expect((await other.call('GET', '/v1/webhooks')).body.data).toEqual([])
    expect((await other.call('GET', `/v1/sessions/resolve?prefix=${sessionId.slice(0, 10)}`)).status).toBe(
      404,
    )
    // And tenant A's session is untouched.
    const info = await t.api.call('GET', `/v1/sessions/${sessionId}`)
    expect(info.body).toMatchObject({ status: 'idle', turnCount: 1 })
    expect((await t.api.call('GET', `/v1/webhooks/${webhookId}`)).body.enabled).toBe(true)
  })

  it("answers every route's request without a key 401 before reading its body, however the path is spelled", async () => {
    const doc = (await fetch(`${t.url}/v1/openapi.json`).then((r) => r.json())) as {
      paths: Record<string, Record<string, unknown>>
    }
    const requests: string[] = []
    for (const [route, methods] of Object.entries(doc.paths)) {
      const path = route.replace(/\{port\}/g, '8000').replace(/\{[^}]+\}/g, sessionId)
      // The router decodes percent-escapes and takes an absolute-form target; the key check must
      // see the route it reaches, not the spelling (`/%761/…` went past it before).
      const spellings = [
        path,
        path.replace('/v1/', '/%761/'),
        path.replace(/^\/(\w)/, (_, c) => `/%${c.charCodeAt(0).toString(16)}`),
        `http://cairn.test${path}`,
      ]
      for (const method of Object.keys(methods))
        for (const spelling of new Set(spellings)) requests.push(`${method.toUpperCase()} ${spelling}`)
    }
    expect(requests.length).toBeGreaterThan(300)
    // All at once (under the per-peer connection cap), so a server waiting for bodies fails in 10 s.
    const statuses = await Promise.all(requests.map((r) => headersOnly(t.url, r)))
    const answers = requests.map((r, i) => [r, statuses[i]] as const)
    const wrong = answers.filter(([, status]) => status !== '401')
    expect(wrong, 'answered otherwise than 401 while the body was still unsent').toEqual([])
  })

  it('lets a read-only key read but not change anything', async () => {
    expect((await readOnly.call('GET', `/v1/sessions/${sessionId}`)).status).toBe(200)
    const send = await readOnly.send(sessionId, 'hello')
    expect(send.status).toBe(403)
    expect((await readOnly.call('POST', '/v1/sessions', { agent: 'echo' })).status).toBe(403)
    expect((await readOnly.call('DELETE', `/v1/sessions/${sessionId}`)).status).toBe(403)
    expect((await readOnly.call('POST', '/v1/keys', {})).status).toBe(403)
  })

  it('lists keys by prefix only and revokes them at once', async () => {
    const created = await t.api.call('POST', '/v1/keys', { name: 'temp' })
    const list = await t.api.call('GET', '/v1/keys')
    expect(JSON.stringify(list.body)).not.toContain(created.body.key)
    const entry = list.body.data.find((k: { id: string }) => k.id === created.body.id)
    expect(created.body.key.startsWith(entry.prefix)).toBe(true)
    const temp = new Api(t.url, created.body.key)
    expect((await temp.call('GET', '/v1/sessions')).status).toBe(200)
    expect((await t.api.call('DELETE', `/v1/keys/${created.body.id}`)).body).toEqual({ ok: true })
    expect((await temp.call('GET', '/v1/sessions')).status).toBe(401)
    // Tenant B cannot revoke tenant A's keys, nor create keys for other tenants.
    expect((await other.call('DELETE', `/v1/keys/${entry.id}`)).status).toBe(404)
    expect((await other.call('POST', '/v1/keys', { tenant: 'tnt_default' })).status).toBe(403)
  })
})

/**
 * A body the route takes, so that the tenant check (404) is what refuses it, not validation
 * (400): each route's by the end of its path, `{}` for the rest.
 */
function bodyFor(url: string): unknown {
  const bodies: [string, unknown][] = [
    ['/messages', { prompt: 'hi' }],
    ['/restore', { snapshotId }],
    ['/fork', { snapshotId }],
    ['/memory', { content: 'x' }],
    ['/artifacts', { path: 'README.md' }],
    ['/lease', { ttlMs: 60_000 }],
    ['/secrets', { secrets: { A: 'b' } }],
    ['/a2a', { jsonrpc: '2.0', id: 1, method: 'GetTask', params: { id: 'trn_x' } }],
    ['/ag-ui', { threadId: 't', runId: 'r', messages: [{ id: 'm', role: 'user', content: 'hi' }] }],
    ['/commands', { command: ['true'] }],
    ['/stdin', { text: 'x' }],
    ['/signal', { signal: 'SIGTERM' }],
    ['/resize', { rows: 24, cols: 80 }],
    ['/answer', { decision: 'approve' }],
  ]
  if (url.endsWith('/workspace'))
    return gzipSync(Buffer.from('not a tar, never read: the tenant check comes first'))
  if (url.includes('/webhooks/')) return { enabled: false }
  return bodies.find(([suffix]) => url.endsWith(suffix))?.[1] ?? {}
}

/**
 * Sends `request` ("METHOD target") without a key, its headers declaring a 1 MiB JSON body that
 * is never sent: the status line it is answered, or "none" when none came within 10 s (the
 * server waiting for the body).
 */
function headersOnly(base: string, request: string): Promise<string> {
  const { hostname, port } = new URL(base)
  return new Promise((resolve) => {
    const socket = connect(Number(port), hostname)
    let answer = ''
    const timer = setTimeout(() => finish('none'), 10_000)
    const finish = (status: string) => {
      clearTimeout(timer)
      socket.destroy()
      resolve(status)
    }
    socket.on('data', (chunk) => {
      answer += chunk.toString('latin1')
      if (answer.includes('\r\n')) finish(answer.split(' ')[1] ?? answer)
    })
    socket.on('error', () => finish(answer || 'reset'))
    socket.write(
      `${request} HTTP/1.1\r\nHost: cairn.test\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n`,
    )
  })
}
