import net from 'node:net'
import { Ajv2020 } from 'ajv/dist/2020.js'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

/**
 * What a third-party checker reading the OpenAPI document finds wrong (Schemathesis, stateful):
 * each case is a place where the document and the server's answers disagreed, or an answer left
 * the registry's shape. The request fuzzer (test/security/fuzz-requests.test.ts) checks the same
 * on every answer it gets; these name each defect on its own.
 */

// biome-ignore lint/suspicious/noExplicitAny: walking an untyped JSON document
type Json = Record<string, any>

let t: TestServer
let doc: Json
let sessionId = ''
const ajv = new Ajv2020({ strict: false })

const operations = () =>
  Object.entries(doc.paths as Json).flatMap(([template, methods]) =>
    Object.entries(methods as Json).map(([method, op]) => ({ template, method, op: op as Json })),
  )

beforeAll(async () => {
  t = await startTestServer()
  doc = await (await fetch(`${t.url}/v1/openapi.json`)).json()
  expect((await t.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
  sessionId = (await t.api.createSession('echo')).id
}, 60_000)

afterAll(async () => {
  await t?.close()
})

const expectError = (res: { status: number; body: Json }, status: number, code: string) => {
  expect(res.status, JSON.stringify(res.body)).toBe(status)
  expect(res.body.error.code).toBe(code)
  expect(res.body.error.requestId).toMatch(/^req_/)
}

describe('the OpenAPI document says what the server does', () => {
  it('marks no query parameter required that the server fills in when it is left out', async () => {
    const required = operations().flatMap(({ template, method, op }) =>
      ((op.parameters ?? []) as Json[])
        .filter((p) => p.in === 'query' && p.required === true && p.schema?.default !== undefined)
        .map((p) => `${method} ${template} ${p.name}`),
    )
    expect(required).toEqual([])
    // And left out, they are answered as their defaults.
    for (const query of ['snapshots', 'manifest', 'files'])
      expect((await t.api.call('GET', `/v1/sessions/${sessionId}/${query}`)).status).toBe(200)
  })

  it('describes an event stream as text, each event’s data in an extension, so a checker can validate both', async () => {
    const streams = operations().flatMap(({ template, method, op }) =>
      Object.values((op.responses ?? {}) as Json).flatMap((response) => {
        const media = (response as Json).content?.['text/event-stream']
        return media ? [{ where: `${method} ${template}`, media: media as Json }] : []
      }),
    )
    expect(streams.length).toBeGreaterThanOrEqual(4)
    const completed = { type: 'run.completed', turnId: 'trn_1', text: 'hi', durationMs: 1 }
    const wire = `event: run.completed\nid: 1\ndata: ${JSON.stringify(completed)}\n\n`
    for (const { where, media } of streams) {
      // The body as a whole is the text of the stream, not one event.
      expect(ajv.validate(media.schema, wire), where).toBe(true)
      const events = media['x-cairn-event-data'] as Json | undefined
      expect(events?.anyOf?.length, where).toBeGreaterThan(1)
      for (const member of events?.anyOf ?? []) expect(typeof member.title, where).toBe('string')
    }
    const run = streams.find((s) => s.where === 'post /v1/sessions/{id}/messages')?.media as Json
    const member = (run['x-cairn-event-data'].anyOf as Json[]).find((m) => m.title === 'run.completed')
    expect(ajv.validate(member as Json, completed)).toBe(true)
  })

  it('states that a restore or fork names a snapshot or a turn, and the validator refuses a body naming neither', async () => {
    for (const action of ['restore', 'fork']) {
      const body =
        doc.paths[`/v1/sessions/{id}/${action}`].post.requestBody.content['application/json'].schema
      expect(ajv.validate(body, {}), action).toBe(false)
      expect(ajv.validate(body, { turn: 1 }), action).toBe(true)
      expect(ajv.validate(body, { snapshotId: 'snap_x' }), action).toBe(true)
      const res = await t.api.call('POST', `/v1/sessions/${sessionId}/${action}`, {})
      expectError(res, 400, 'validation_failed')
      expect(res.body.error.message).toBe("body must have required property 'snapshotId' or 'turn'")
      expect(res.body.error.details.issues.map((i: Json) => i.keyword)).toContain('required')
    }
  })
})

describe('answers outside the routes are in the registry’s shape', () => {
  it('answers a method a known path does not take with 405 and Allow', async () => {
    const agents = await t.api.call('DELETE', '/v1/agents')
    expectError(agents, 405, 'method_not_allowed')
    expect(agents.body.error.details.allow).toEqual(['GET', 'HEAD', 'POST'])
    const res = await fetch(`${t.url}/v1/sessions/${sessionId}`, {
      method: 'PATCH',
      headers: { authorization: `Bearer ${t.key}` },
    })
    expect(res.status).toBe(405)
    expect(res.headers.get('allow')).toBe('DELETE, GET, HEAD')
    // The methods the document lists for the path, and HEAD beside GET.
    const documented = Object.keys(doc.paths['/v1/sessions/{id}']).map((m) => m.toUpperCase())
    expect(res.headers.get('allow')?.split(', ')).toEqual([...documented, 'HEAD'].sort())
    // A path no route has is still 404.
    expectError(await t.api.call('DELETE', '/v1/nothing-here'), 404, 'not_found')
  })

  it('answers headers larger than the server reads with 431 and a registry code', async () => {
    const raw = await rawRequest(
      `GET /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${t.key}\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
    )
    const [head = '', body = ''] = raw.split('\r\n\r\n')
    expect(head).toMatch(/^HTTP\/1\.1 431 /)
    expect(head.toLowerCase()).toContain('content-type: application/json')
    expectError({ status: 431, body: JSON.parse(body) }, 431, 'headers_too_large')
    // The server goes on answering.
    expect((await t.api.call('GET', '/v1/sessions')).status).toBe(200)
  })

  it('refuses a file written onto a directory, or under a file, with 409 naming why, and changes nothing', async () => {
    const put = (path: string) =>
      t.api.call('PUT', `/v1/sessions/${sessionId}/files/content?path=${path}`, Buffer.from('bytes'), {
        'content-type': 'application/octet-stream',
      })
    expect((await put('dir/inside.txt')).status).toBe(200)
    const onto = await put('dir')
    expectError(onto, 409, 'conflict')
    expect(onto.body.error.message).toBe(
      '/workspace/dir is a directory: a file cannot be written over it (delete it first, or name a file inside it)',
    )
    const under = await put('dir/inside.txt/below.txt')
    expectError(under, 409, 'conflict')
    expect(under.body.error.message).toBe(
      '/workspace/dir/inside.txt is a file, not a directory: /workspace/dir/inside.txt/below.txt cannot be written under it',
    )
    const listing = await t.api.call('GET', `/v1/sessions/${sessionId}/files?path=dir`)
    expect(listing.body.data.map((e: Json) => e.name)).toEqual(['inside.txt'])
    const read = await t.api.call('GET', `/v1/sessions/${sessionId}/files/content?path=dir/inside.txt`)
    expect(read.body).toBe('bytes')
  })
})

/** Sends bytes as they are and reads the answer until the server closes the connection. */
function rawRequest(text: string): Promise<string> {
  const { hostname, port } = new URL(t.url)
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), hostname, () => socket.end(text))
    const chunks: Buffer[] = []
    socket.on('data', (chunk) => chunks.push(chunk))
    socket.on('close', () => resolve(Buffer.concat(chunks).toString('utf8')))
    socket.on('error', (error: NodeJS.ErrnoException) => {
      // The server closes after its answer; a reset after the answer arrived is the same close.
      if (chunks.length > 0) resolve(Buffer.concat(chunks).toString('utf8'))
      else reject(error)
    })
  })
}
