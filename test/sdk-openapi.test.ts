import {
  AgentSchema,
  DiffSchema,
  FileEntrySchema,
  MessageSchema,
  RevisionSchema,
  SessionSchema,
  SnapshotSchema,
  StatusEventSchema,
  TurnSchema,
} from '@cairn/protocol'
import { API_KEY_INFO_FIELDS, Cairn, SECRET_INFO_FIELDS } from '@cairn/sdk'
import type { TSchema } from '@sinclair/typebox'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startTestServer, type TestServer } from './helpers/server.js'

/**
 * The SDK's requests and types against the server's generated OpenAPI document: a route the SDK
 * calls that the document lacks, a field it sends that the route does not accept, or a response
 * field set that differs from the types the SDK exposes, fails here.
 */
// biome-ignore lint/suspicious/noExplicitAny: walking an untyped JSON document
type Json = Record<string, any>

let t: TestServer
let doc: Json

beforeAll(async () => {
  t = await startTestServer()
  doc = await (
    await fetch(`${t.url}/v1/openapi.json`, { headers: { authorization: `Bearer ${t.key}` } })
  ).json()
})

afterAll(async () => {
  await t?.close()
})

interface Call {
  method: string
  path: string
  query: string[]
  body: string[]
}

/** Drives every SDK method through a recording fetch (answers are fake; only the requests matter). */
async function recordSdkCalls(): Promise<Call[]> {
  const calls: Call[] = []
  const sse = 'event: run.completed\ndata: {"type":"run.completed","turnId":"t","text":"","durationMs":1}\n\n'
  const client = new Cairn({
    baseUrl: 'http://sdk.test',
    apiKey: 'k',
    fetch: async (input, init) => {
      const url = new URL(input)
      const body = typeof init.body === 'string' ? Object.keys(JSON.parse(init.body)) : []
      calls.push({
        method: String(init.method),
        path: url.pathname,
        query: [...url.searchParams.keys()],
        body,
      })
      return new Response(url.pathname.endsWith('/messages') && init.method === 'POST' ? sse : '{}', {
        status: 200,
      })
    },
  })
  const id = 'ses_aaaaaaaaaaaaaaaaaaaa'
  const attempts: (() => Promise<unknown>)[] = [
    () => client.agents.list(),
    () => client.agents.get('echo'),
    () => client.agents.delete('echo'),
    () => client.agents.deploy(new Uint8Array(1), { name: 'x', wait: true }),
    () => client.agents.revision('echo', 'rev_x'),
    () => client.agents.logs('echo', 'rev_x'),
    async () => {
      for await (const _ of client.agents.followLogs('echo', 'rev_x')) break
    },
    () =>
      client.createSession('echo', {
        title: 't',
        idleTimeoutMs: 1000,
        keepWarmMs: 1000,
        autoSnapshots: false,
      }),
    () => client.sessions.get(id),
    () => client.sessions.resolve('ses_a'),
    () => client.sessions.list({ agent: 'echo', status: 'idle', limit: 5, cursor: 'c' }),
    () => client.sessions.delete(id),
    () => client.sessions.end(id),
    () => client.sessions.resume(id),
    () => client.sessions.cancel(id),
    () => client.sessions.messages(id),
    () => client.sessions.events(id),
    () => client.sessions.turns(id),
    () => client.sessions.run(id, 'hi'),
    () => client.sessions.manifest(id),
    () => client.sessions.lease(id, 60_000),
    () => client.sessions.previewUrl(id, 8000, { ttlMs: 60_000 }),
    () => client.sessions.revokePreviewUrls(id, 8000),
    () => client.sessions.snapshots(id).create({ label: 'l' }),
    () => client.sessions.snapshots(id).list(),
    () => client.sessions.snapshots(id).list({ digest: true }),
    () => client.sessions.snapshots(id).get('snap_x', { digest: true }),
    () => client.sessions.snapshots(id).digest('snap_x'),
    () => client.sessions.snapshots(id).delete('snap_x'),
    () => client.sessions.snapshots(id).restore({ snapshotId: 'snap_x' }),
    () => client.sessions.snapshots(id).restore({ turn: 1 }),
    () => client.sessions.snapshots(id).undo(),
    () => client.sessions.snapshots(id).fork({ snapshotId: 'snap_x', turn: 1, title: 't' }),
    () => client.sessions.files(id).list('dir', { snapshot: 'snap_x' }),
    () => client.sessions.files(id).read('a.txt', { snapshot: 'snap_x' }),
    () => client.sessions.files(id).write('a.txt', 'x'),
    () => client.sessions.files(id).delete('a.txt'),
    () => client.sessions.files(id).diff({ from: 'snap_x' }),
    () => client.sessions.files(id).export({ snapshot: 'snap_x' }),
    () => client.sessions.files(id).import(new Uint8Array(1), { merge: true }),
    () => client.secrets.list('echo'),
    () => client.secrets.set('echo', { A: 'b' }, { scope: 'runtime' }),
    () => client.secrets.delete('echo', 'A'),
    () => client.keys.create({ tenant: 't', role: 'read', name: 'n' }),
    () => client.keys.list(),
    () => client.keys.revoke('key_x'),
  ]
  for (const attempt of attempts) await attempt().catch(() => undefined)
  return calls
}

/** The document's route for a concrete path: literal segments win over `{param}` ones. */
function route(path: string): string | undefined {
  const candidates = Object.keys(doc.paths).filter((template) =>
    new RegExp(`^${template.replace(/\{[^}]+\}/g, '[^/]+')}$`).test(path),
  )
  return candidates.sort((a, b) => (a.match(/\{/g)?.length ?? 0) - (b.match(/\{/g)?.length ?? 0))[0]
}

function responseSchema(path: string, method: string, status = '200'): Json {
  return doc.paths[path][method].responses[status].content['application/json'].schema
}

const keys = (schema: TSchema | Json) => Object.keys((schema as Json).properties ?? {}).sort()
const required = (schema: TSchema | Json) => [...((schema as Json).required ?? [])].sort()

function expectSameShape(actual: Json, expected: TSchema, what: string) {
  expect(keys(actual), `${what}: properties`).toEqual(keys(expected))
  expect(required(actual), `${what}: required`).toEqual(required(expected))
}

describe('SDK and the OpenAPI document', () => {
  it('calls only routes the document has, with accepted query and body fields', async () => {
    const calls = await recordSdkCalls()
    expect(calls.length).toBeGreaterThanOrEqual(39)
    for (const call of calls) {
      const template = route(call.path)
      expect(template, `${call.method} ${call.path} is not in the document`).toBeDefined()
      const operation = doc.paths[template as string][call.method.toLowerCase()]
      expect(operation, `${call.method} ${template} is not in the document`).toBeDefined()
      const queryParams = (operation.parameters ?? [])
        .filter((p: Json) => p.in === 'query')
        .map((p: Json) => p.name)
      for (const q of call.query) expect(queryParams, `${call.method} ${template} ?${q}`).toContain(q)
      const bodySchema = operation.requestBody?.content?.['application/json']?.schema
      for (const field of call.body)
        expect(keys(bodySchema ?? {}), `${call.method} ${template} body.${field}`).toContain(field)
    }
  })

  it('answers with the shapes the SDK types describe', () => {
    expectSameShape(responseSchema('/v1/sessions/{id}', 'get'), SessionSchema, 'session')
    expectSameShape(responseSchema('/v1/sessions', 'post', '201'), SessionSchema, 'created session')
    expectSameShape(responseSchema('/v1/sessions/resolve', 'get'), SessionSchema, 'resolved session')
    expectSameShape(
      responseSchema('/v1/sessions', 'get').properties.data.items,
      SessionSchema,
      'listed session',
    )
    expect(keys(responseSchema('/v1/sessions', 'get'))).toEqual(['data', 'nextCursor'])
    expectSameShape(
      responseSchema('/v1/sessions/{id}/messages', 'get').properties.data.items,
      MessageSchema,
      'message',
    )
    expectSameShape(
      responseSchema('/v1/sessions/{id}/events', 'get').properties.data.items,
      StatusEventSchema,
      'event',
    )
    expectSameShape(
      responseSchema('/v1/sessions/{id}/turns', 'get').properties.data.items,
      TurnSchema,
      'turn',
    )
    expectSameShape(responseSchema('/v1/agents', 'get').properties.data.items, AgentSchema, 'agent')
    expectSameShape(
      responseSchema('/v1/agents', 'post', '201').properties.agent,
      AgentSchema,
      'deployed agent',
    )
    expectSameShape(
      responseSchema('/v1/agents', 'post', '201').properties.revision,
      RevisionSchema,
      'revision',
    )
    expectSameShape(responseSchema('/v1/agents/{id}/revisions/{rev}', 'get'), RevisionSchema, 'revision')
    expectSameShape(responseSchema('/v1/sessions/{id}/snapshots', 'post', '201'), SnapshotSchema, 'snapshot')
    expectSameShape(
      responseSchema('/v1/sessions/{id}/snapshots/{snapshotId}', 'get'),
      SnapshotSchema,
      'snapshot',
    )
    expectSameShape(
      responseSchema('/v1/sessions/{id}/snapshots', 'get').properties.data.items,
      SnapshotSchema,
      'snapshots',
    )
    expectSameShape(
      responseSchema('/v1/sessions/{id}/restore', 'post').properties.snapshot,
      SnapshotSchema,
      'restored',
    )
    expectSameShape(responseSchema('/v1/sessions/{id}/fork', 'post', '201'), SessionSchema, 'fork')
    expectSameShape(
      responseSchema('/v1/sessions/{id}/files', 'get').properties.data.items,
      FileEntrySchema,
      'file',
    )
    expectSameShape(responseSchema('/v1/sessions/{id}/diff', 'get'), DiffSchema, 'diff')
    const secrets = responseSchema('/v1/agents/{id}/secrets', 'get')
    expect(keys(secrets)).toEqual(['data', 'missing'])
    // `hosts` and `headers` are optional (proxy secrets only), typed apart from the always-present string fields.
    expect(keys(secrets.properties.data.items)).toEqual(
      [...SECRET_INFO_FIELDS, 'expiresAt', 'headers', 'hosts'].sort(),
    )
    const apiKeys = responseSchema('/v1/keys', 'get')
    expect(keys(apiKeys)).toEqual(['data'])
    expect(keys(apiKeys.properties.data.items)).toEqual([...API_KEY_INFO_FIELDS].sort())
    expect(keys(responseSchema('/v1/keys', 'post', '201'))).toEqual(['id', 'key', 'role', 'tenantId'])
    expect(keys(responseSchema('/v1/keys/{id}', 'delete'))).toEqual(['ok'])
    expect(keys(responseSchema('/v1/sessions/{id}/lease', 'post'))).toEqual(['leaseUntil', 'sessionId'])
  })
})
