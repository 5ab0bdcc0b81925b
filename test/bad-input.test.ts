import { existsSync } from 'node:fs'
import { readdir } from 'node:fs/promises'
import { connect } from 'node:net'
import path from 'node:path'
import { isDeepStrictEqual } from 'node:util'
import { readManifest } from '@cairn/server'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { bodyFields, JSON_KINDS, wrongValue } from './helpers/body-fields.js'
import type { JsonSchema } from './helpers/fuzz.js'
import { makeProject } from './helpers/projects.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  expect((await t.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
  const slow = await makeProject({
    'cairn.yaml': 'name: slow\ncommand: python3 slow.py\n',
    'slow.py':
      'import time\nwhile True:\n    line = input()\n    time.sleep(1.0)\n    print("done " + line)\n',
  })
  expect((await t.api.deploy(slow)).status).toBe(201)
  const crash = await makeProject({
    'cairn.yaml': 'name: crasher\ncommand: python3 crash.py\n',
    'crash.py': [
      'import sys',
      'while True:',
      '    line = input()',
      '    if line == "crash":',
      '        print("partial answer", flush=True)',
      '        open("before-crash.txt", "w").write("kept")',
      '        raise RuntimeError("boom: the agent fell over")',
      '    print("ok " + line)',
    ].join('\n'),
  })
  expect((await t.api.deploy(crash)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

describe('bad input gets a clear, typed error and loses nothing', () => {
  it('refuses requests without a valid API key', async () => {
    const anonymous = await fetch(`${t.url}/v1/sessions`)
    expect(anonymous.status).toBe(401)
    expect((await anonymous.json()).error.code).toBe('unauthorized')
    const wrong = await fetch(`${t.url}/v1/sessions`, { headers: { authorization: 'Bearer cairn_sk_nope' } })
    expect(wrong.status).toBe(401)
    const health = await fetch(`${t.url}/healthz`)
    expect(health.status).toBe(200)
  })

  it('answers unknown agents and sessions with 404 and a code', async () => {
    const agent = await t.api.call('POST', '/v1/sessions', { agent: 'no-such-agent' })
    expect(agent.status).toBe(404)
    expect(agent.body.error.code).toBe('agent_not_found')
    const session = await t.api.call('GET', '/v1/sessions/ses_00000000000000000000')
    expect(session.status).toBe(404)
    expect(session.body.error.code).toBe('session_not_found')
    expect(session.body.error.requestId).toMatch(/^req_/)
    const message = await t.api.send('ses_00000000000000000000', 'hello')
    expect(message.status).toBe(404)
    const route = await t.api.call('GET', '/v1/nothing-here')
    expect(route.status).toBe(404)
    expect(route.body.error.code).toBe('not_found')
  })

  it('answers malformed JSON, empty prompts and unknown fields with 400', async () => {
    const session = await t.api.createSession('echo')
    const malformed = await t.api.call('POST', `/v1/sessions/${session.id}/messages`, '{"prompt": ')
    expect(malformed.status).toBe(400)
    expect(malformed.body.error.code).toBe('invalid_json')
    const empty = await t.api.send(session.id, '')
    expect(empty.status).toBe(400)
    expect((empty.body as { error: { code: string } }).error.code).toBe('validation_failed')
    const blank = await t.api.send(session.id, '   ')
    expect(blank.status).toBe(400)
    const extra = await t.api.call('POST', '/v1/sessions', { agent: 'echo', colour: 'red' })
    expect(extra.status).toBe(400)
    expect(extra.body.error.code).toBe('validation_failed')
    const badTimeout = await t.api.call('POST', '/v1/sessions', { agent: 'echo', idleTimeoutMs: -5 })
    expect(badTimeout.status).toBe(400)
    // Nothing was lost: the session still answers.
    expect((await t.api.send(session.id, 'still here')).text).toBe('still here\n')
  })

  it('refuses a second message while a turn runs with 409 session_busy', async () => {
    const session = await t.api.createSession('slow')
    const first = t.api.send(session.id, 'one')
    await new Promise((r) => setTimeout(r, 300))
    const second = await t.api.send(session.id, 'two')
    expect(second.status).toBe(409)
    expect((second.body as { error: { code: string } }).error.code).toBe('session_busy')
    const done = await first
    expect(done.text).toBe('done one\n')
    const transcript = await t.api.call('GET', `/v1/sessions/${session.id}/messages`)
    expect(transcript.body.data).toHaveLength(2)
  })

  it('cancels a running turn and leaves the session usable', async () => {
    const session = await t.api.createSession('slow')
    const run = t.api.send(session.id, 'long')
    await new Promise((r) => setTimeout(r, 300))
    const cancel = await t.api.call('POST', `/v1/sessions/${session.id}/cancel`)
    expect(cancel.body).toEqual({ ok: true })
    expect((await run).terminal?.type).toBe('run.cancelled')
    expect((await t.api.send(session.id, 'after')).text).toBe('done after\n')
  })

  it('reports a crashing agent as run.failed with its stderr tail, and the session resumes intact', async () => {
    const session = await t.api.createSession('crasher')
    expect((await t.api.send(session.id, 'hi')).text).toBe('ok hi\n')
    const crashed = await t.api.send(session.id, 'crash')
    expect(crashed.terminal?.type).toBe('run.failed')
    const failure = crashed.terminal as { error: { code: string; message: string } }
    expect(failure.error.code).toBe('agent_crashed')
    expect(failure.error.message).toContain('RuntimeError: boom: the agent fell over')
    expect(crashed.text).toBe('partial answer\n')
    const info = await t.api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body).toMatchObject({ status: 'failed', statusCause: 'agent_crash' })
    const turns = await t.api.call('GET', `/v1/sessions/${session.id}/turns`)
    expect(turns.body.data[1].stderrTail).toContain('Traceback')

    const resumed = await t.api.call('POST', `/v1/sessions/${session.id}/resume`)
    expect(resumed.body.status).toBe('idle')
    expect((await t.api.send(session.id, 'again')).text).toBe('ok again\n')
  })

  it('refuses non-archive deploys and archives without a manifest', async () => {
    const notGzip = await t.api.call('POST', '/v1/agents', Buffer.from('definitely not a tarball'))
    expect(notGzip.status).toBe(400)
    expect(notGzip.body.error.code).toBe('invalid_archive')
    const noManifest = await makeProject({ 'main.py': 'print(1)\n' })
    const res = await t.api.deploy(noManifest)
    expect(res.status).toBe(400)
    expect(res.body.error.code).toBe('invalid_manifest')
    const badName = await makeProject({ 'cairn.yaml': 'name: Bad Name!\ncommand: bash x.sh\n' })
    const bad = await t.api.deploy(badName)
    expect(bad.status).toBe(400)
    expect(bad.body.error.message).toContain('name')
    const json = await t.api.call('POST', '/v1/agents', { name: 'x' })
    expect(json.status).toBe(415)
  })

  it('takes an empty body with Content-Type: application/json as no body, on every body-less route', async () => {
    // Many clients send the header on every request; an empty body is no body, not broken JSON.
    const emptyJson = (method: string, route: string) =>
      t.api.call(method, route, '', { 'content-type': 'application/json' })
    const session = await t.api.createSession('echo')
    expect((await t.api.send(session.id, 'hi')).text).toBe('hi\n')
    const snapshot = await emptyJson('POST', `/v1/sessions/${session.id}/snapshots`)
    expect(snapshot.status, JSON.stringify(snapshot.body)).toBe(201)
    const cancel = await emptyJson('POST', `/v1/sessions/${session.id}/cancel`)
    expect(cancel.status, JSON.stringify(cancel.body)).toBe(200)
    const end = await emptyJson('POST', `/v1/sessions/${session.id}/end`)
    expect(end.status, JSON.stringify(end.body)).toBe(200)
    expect(end.body.status).toBe('completed')
    const resume = await emptyJson('POST', `/v1/sessions/${session.id}/resume`)
    expect(resume.status, JSON.stringify(resume.body)).toBe(200)
    expect(resume.body.status).toBe('idle')
    const undo = await emptyJson('POST', `/v1/sessions/${session.id}/undo`)
    expect(undo.status, JSON.stringify(undo.body)).toBe(200)
    const key = await t.api.call('POST', '/v1/keys', { name: 'throwaway' })
    expect(key.status).toBe(201)
    const deleteKey = await emptyJson('DELETE', `/v1/keys/${key.body.id}`)
    expect(deleteKey.status, JSON.stringify(deleteKey.body)).toBe(200)
    const deleted = await emptyJson('DELETE', `/v1/sessions/${session.id}`)
    expect(deleted.status, JSON.stringify(deleted.body)).toBe(200)
    // Whatever the type an empty body claims, it is no body.
    const other = await t.api.createSession('echo')
    const form = await t.api.call('POST', `/v1/sessions/${other.id}/end`, '', {
      'content-type': 'application/x-www-form-urlencoded',
    })
    expect(form.status, JSON.stringify(form.body)).toBe(200)
    // A route whose body is required still says so, as a validation error about the body.
    const create = await emptyJson('POST', '/v1/sessions')
    expect(create.status).toBe(400)
    expect(create.body.error.code).toBe('validation_failed')
    // Broken JSON is still broken JSON.
    const broken = await t.api.call('POST', `/v1/sessions/${session.id}/end`, '{', {
      'content-type': 'application/json',
    })
    expect(broken.body.error.code).toBe('invalid_json')
  })

  it('names the limit that applies when a body is too large: JSON bodies and uploads each their own', async () => {
    const session = await t.api.createSession('echo')
    const bigJson = JSON.stringify({ prompt: 'x'.repeat(3 * 1024 * 1024) })
    const json = await t.api.call('POST', `/v1/sessions/${session.id}/messages`, bigJson)
    expect(json.status).toBe(413)
    expect(json.body.error.code).toBe('payload_too_large')
    expect(json.body.error.message).toContain('2097152 bytes (2 MiB)')
    expect(json.body.error.message).toContain('JSON')
    expect(json.body.error.message).not.toContain('104857600')
    expect(json.body.error.details).toEqual({ limitBytes: 2097152 })
    // An upload is held to its own limit (100 MiB here; test/archive.test.ts sees it named), not the JSON one.
    const upload = await t.api.call('POST', '/v1/agents', Buffer.alloc(3 * 1024 * 1024, 7))
    expect(upload.status).toBe(400)
    expect(upload.body.error.code).toBe('invalid_archive')
  })

  it('refuses cairn.yaml keys nobody reads, at every level, naming the key and the nearest known one', async () => {
    const refused = async (manifest: string) => {
      const res = await t.api.deploy(await makeProject({ 'cairn.yaml': manifest, 'a.sh': 'cat\n' }))
      expect(res.status, manifest).toBe(400)
      expect(res.body.error.code, manifest).toBe('invalid_manifest')
      return res.body.error.message as string
    }
    const base = 'name: typo\ncommand: bash a.sh\n'
    expect(await refused(`${base}netwrok:\n  allow: [example.com]\n`)).toBe(
      "unknown key 'netwrok' in cairn.yaml; did you mean 'network'?",
    )
    expect(await refused(`${base}limtis:\n  memoryMiB: 256\n`)).toContain("did you mean 'limits'?")
    expect(await refused(`${base}foo: bar\n`)).toMatch(
      /^unknown key 'foo' in cairn\.yaml; known keys: name, command, /,
    )
    expect(await refused(`${base}limits:\n  memroyMiB: 256\n`)).toBe(
      "unknown key 'memroyMiB' in 'limits' of cairn.yaml; did you mean 'memoryMiB'?",
    )
    expect(await refused(`${base}network:\n  allow:\n    - host: example.com\n      method: [GET]\n`)).toBe(
      "unknown key 'method' in 'network.allow.0' of cairn.yaml; did you mean 'methods'?",
    )
    expect(await refused(`${base}session:\n  setpu: make\n`)).toContain("did you mean 'setup'?")
    expect(await refused(`${base}session:\n  setup:\n    command: make\n    timeout: 5000\n`)).toBe(
      "unknown key 'timeout' in 'session.setup' of cairn.yaml; did you mean 'timeoutMs'?",
    )
    // An image Cairn cannot make (no registry host: Docker Hub is not implied) is refused, saying what is accepted.
    expect(await refused(`${base}image: python:3.12\n`)).toContain(
      "image 'python:3.12' is none of 'host', 'debian:<suite>' or an OCI reference",
    )
    // Free-form maps (a setup phase's environment) take any names.
    const env = await t.api.deploy(
      await makeProject({
        'cairn.yaml': `${base}session:\n  setup:\n    command: "true"\n    env:\n      ANY_NAME: x\n`,
        'a.sh': 'cat\n',
      }),
    )
    expect(env.status, JSON.stringify(env.body)).toBe(201)
  })

  it('reads every example cairn.yaml without an unknown key', async () => {
    const dirs = (await readdir(EXAMPLES, { withFileTypes: true })).filter((d) => d.isDirectory())
    let checked = 0
    for (const dir of dirs) {
      const project = path.join(EXAMPLES, dir.name)
      if (!existsSync(path.join(project, 'cairn.yaml'))) continue
      await expect(readManifest(project), dir.name).resolves.toMatchObject({ name: expect.any(String) })
      checked++
    }
    expect(checked).toBeGreaterThan(5)
  })

  it("answers what Node's HTTP server refused bare, a request without Host and an unmet Expect, in the registry's shape", async () => {
    const auth = `Authorization: Bearer ${t.key}\r\n`
    const noHost = await rawExchange(t.url, `GET /v1/sessions HTTP/1.1\r\n${auth}Connection: close\r\n\r\n`)
    expect(noHost).toMatch(/^HTTP\/1\.1 400 /)
    expect(noHost).toContain('"code":"bad_request"')
    expect(noHost).toContain('Host header')
    const body = '{"agent":"echo"}'
    const framing = `Host: x\r\n${auth}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n`
    const unmet = await rawExchange(t.url, `POST /v1/sessions HTTP/1.1\r\n${framing}Expect: 200-ok\r\n\r\n`)
    expect(unmet).toMatch(/^HTTP\/1\.1 400 /)
    expect(unmet).toContain('"code":"bad_request"')
    expect(unmet).toContain('only 100-continue')
    // 100-continue is met: the client is told to go on, and its request is answered.
    const met = await rawExchange(
      t.url,
      `POST /v1/sessions HTTP/1.1\r\n${framing}Expect: 100-continue\r\nConnection: close\r\n\r\n`,
      body,
    )
    expect(met).toMatch(/^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 201 /)
  })

  it('names the unknown field of a request body and the nearest known one, at any depth', async () => {
    const top = await t.api.call('POST', '/v1/sessions', { agent: 'echo', idleTimeout: 5000 })
    expect(top.status).toBe(400)
    expect(top.body.error.code).toBe('validation_failed')
    expect(top.body.error.message).toBe("unknown field 'idleTimeout' in body; did you mean 'idleTimeoutMs'?")
    const nested = await t.api.call('POST', '/v1/sessions', { agent: 'echo', policy: { maxTurn: 3 } })
    expect(nested.status).toBe(400)
    expect(nested.body.error.message).toBe(
      "unknown field 'maxTurn' in 'policy' of body; did you mean 'maxTurns'?",
    )
    const far = await t.api.call('POST', '/v1/sessions', { agent: 'echo', colour: 'red' })
    expect(far.body.error.message).toMatch(/^unknown field 'colour' in body; known fields: agent, title, /)
    // A query string's unknown field is named as the query string's (it was said to be the body's).
    const query = await t.api.call('GET', '/v1/sessions?limit[]=1')
    expect(query.status).toBe(400)
    expect(query.body.error.message).toBe(
      "unknown field 'limit[]' in the query string; did you mean 'limit'?",
    )
    // A value out of a union of values names those it may be (it said "equal to constant" six times).
    const status = await t.api.call('GET', '/v1/sessions?status=bogus')
    expect(status.body.error.message).toBe(
      "querystring/status must be 'active' or 'idle' or 'completed' or 'failed' or 'timeout' or 'deleted'",
    )
    const twice = await t.api.call('GET', '/v1/sessions?status=active&status=idle')
    expect(twice.body.error.message).toBe(
      "querystring/status must be string or 'active' or 'idle' or 'completed' or 'failed' or 'timeout' or 'deleted'",
    )
  })
})

describe('a JSON body is validated as typed: nothing is coerced', () => {
  interface BodyOperation {
    method: string
    template: string
    schema: JsonSchema
  }
  const jsonBodyOperations = (doc: {
    paths: Record<
      string,
      Record<string, { requestBody?: { content?: Record<string, { schema: JsonSchema }> } }>
    >
  }): BodyOperation[] =>
    Object.entries(doc.paths).flatMap(([template, ops]) =>
      Object.entries(ops).flatMap(([method, op]) => {
        const schema = op.requestBody?.content?.['application/json']?.schema
        return schema ? [{ method: method.toUpperCase(), template, schema }] : []
      }),
    )
  /** What 400 answer a wrongly typed field must get; undefined when it got it. */
  interface Answer {
    status: number
    body: { error?: { code?: string; message?: string; details?: { issues?: { instancePath: string }[] } } }
  }
  const misjudged = (res: Answer, path: string[]): string | undefined => {
    const error = res.body?.error
    if (res.status !== 400 || error?.code !== 'validation_failed')
      return `answered ${res.status} ${JSON.stringify(res.body).slice(0, 200)}`
    const pointer = path.map((p) => `/${p}`).join('')
    const issues = error.details?.issues ?? []
    if (!issues.some((issue) => issue.instancePath === pointer))
      return `no issue at ${pointer}: ${JSON.stringify(issues)}`
    const elsewhere = issues.find(
      (i) => i.instancePath !== pointer && !pointer.startsWith(`${i.instancePath}/`),
    )
    if (elsewhere) return `an issue off the field, at ${elsewhere.instancePath}`
    if (!String(error.message).includes(`body${pointer}`)) return `the message does not name body${pointer}`
    return undefined
  }

  it('refuses each wrong JSON type of every field of every JSON body in the OpenAPI document with 400 naming it, and changes nothing', async () => {
    const session = await t.api.createSession('echo')
    expect((await t.api.send(session.id, 'hi')).text).toBe('hi\n')
    await t.api.snapshotAfter(session.id, 1)
    const agentId = (await t.api.call('GET', '/v1/agents')).body.data.find(
      (a: { name: string }) => a.name === 'echo',
    ).id as string
    // A documentation address (public to the guard) and an event a single server never sends (a
    // node lost, in a cluster only): nothing is delivered.
    const webhookId = (
      await t.api.call('POST', '/v1/webhooks', {
        url: 'https://203.0.113.10/hook',
        events: ['session.node_lost'],
      })
    ).body.id as string
    const state = async () => {
      const reads = [
        '/v1/sessions?limit=500',
        `/v1/sessions/${session.id}`,
        `/v1/sessions/${session.id}/snapshots`,
        `/v1/sessions/${session.id}/turns`,
        `/v1/sessions/${session.id}/files`,
        '/v1/agents',
        `/v1/agents/${agentId}/secrets`,
        `/v1/agents/${agentId}/memory`,
        `/v1/agents/${agentId}/artifacts`,
        '/v1/keys',
        '/v1/retention',
        '/v1/webhooks',
      ]
      return Object.fromEntries(
        await Promise.all(reads.map(async (r) => [r, (await t.api.call('GET', r)).body])),
      )
    }
    const doc = await (await fetch(`${t.url}/v1/openapi.json`)).json()
    const operations = jsonBodyOperations(doc)
    expect(operations.length).toBeGreaterThanOrEqual(15)
    const findings: string[] = []
    let sent = 0
    for (const op of operations) {
      const url = op.template
        .replace(/^\/v1\/agents\/\{id\}/, `/v1/agents/${agentId}`)
        .replace(/^\/v1\/sessions\/\{id\}/, `/v1/sessions/${session.id}`)
        .replace(/^\/v1\/webhooks\/\{id\}/, `/v1/webhooks/${webhookId}`)
        .replace('{port}', '8080')
        .replace('{commandId}', 'cmd_00000000000000000000')
        .replace('{approvalId}', 'apr_00000000000000000000')
      expect(url, op.template).not.toContain('{')
      const before = await state()
      // The body itself of a wrong type (a field at the root), then each field at any depth.
      const root = { path: [], schema: op.schema, bodyWith: (value: unknown) => value }
      for (const field of [root, ...bodyFields(op.schema)]) {
        for (const kind of JSON_KINDS) {
          const value = wrongValue(field.schema, kind)
          // A JSON null for the whole body is a wrong type too (only an absent body is `{}`).
          if (value === undefined) continue
          const res = await t.api.call(op.method, url, JSON.stringify(field.bodyWith(value)))
          sent++
          const wrong = misjudged(res, field.path)
          if (wrong)
            findings.push(
              `${op.method} ${op.template} ${field.path.join('.')}=${JSON.stringify(value)}: ${wrong}`,
            )
        }
      }
      const after = await state()
      for (const read of Object.keys(before)) {
        if (!isDeepStrictEqual(after[read], before[read]))
          findings.push(`${op.method} ${op.template} changed what GET ${read} answers`)
      }
    }
    console.log(`[bad-input] ${sent} wrongly typed bodies over ${operations.length} operations`)
    expect(findings).toEqual([])
    expect(sent).toBeGreaterThan(300)
  })

  it('bounds every number a request carries, so none reaches the database out of its range', async () => {
    // Unbounded, 1e20 as a TTL or a turn was a 500 from PostgreSQL's BIGINT (SQLite stored a float).
    const doc = await (await fetch(`${t.url}/v1/openapi.json`)).json()
    const unbounded: string[] = []
    const walk = (schema: JsonSchema | undefined, at: string) => {
      if (!schema) return
      if ((schema.type === 'integer' || schema.type === 'number') && schema.maximum === undefined)
        unbounded.push(at)
      for (const [name, child] of Object.entries(schema.properties ?? {})) walk(child, `${at}.${name}`)
      for (const branch of schema.anyOf ?? []) walk(branch, at)
      walk(schema.items, `${at}[]`)
      if (typeof schema.additionalProperties === 'object') walk(schema.additionalProperties, `${at}.*`)
    }
    type Op = {
      requestBody?: { content?: Record<string, { schema: JsonSchema }> }
      parameters?: { in: string; name: string; schema: JsonSchema }[]
    }
    for (const [template, ops] of Object.entries(doc.paths as Record<string, Record<string, Op>>)) {
      for (const [method, op] of Object.entries(ops)) {
        const where = `${method.toUpperCase()} ${template}`
        walk(op.requestBody?.content?.['application/json']?.schema, `${where} body`)
        for (const p of op.parameters ?? []) walk(p.schema, `${where} ${p.in} ${p.name}`)
      }
    }
    expect(unbounded).toEqual([])
    const huge = await t.api.call('PUT', '/v1/retention', { endedWorkspaceTtlMs: 1e20 })
    expect(huge.status).toBe(400)
    expect(huge.body.error.message).toBe('body/endedWorkspaceTtlMs must be <= 9007199254740991 or null')
    const session = await t.api.createSession('echo')
    const restore = await t.api.call('POST', `/v1/sessions/${session.id}/restore`, { turn: 1e20 })
    expect(restore.body.error.code).toBe('validation_failed')
  })

  it('still reads numbers and booleans from query strings and path parameters, which are text', async () => {
    const listed = await t.api.call('GET', '/v1/sessions?limit=1')
    expect(listed.status).toBe(200)
    expect(listed.body.data).toHaveLength(1)
    expect((await t.api.call('GET', '/v1/usage?storage=true')).status).toBe(200)
    expect((await t.api.call('GET', '/v1/sessions?limit=one')).body.error.code).toBe('validation_failed')
  })
})

/**
 * Sends `head` on a connection of its own (then `body` once the server answered something), and
 * gives what came back until the server closed it or 5 s passed.
 */
function rawExchange(base: string, head: string, body?: string): Promise<string> {
  const { hostname, port } = new URL(base)
  return new Promise((resolve) => {
    const socket = connect(Number(port), hostname)
    let answer = ''
    const timer = setTimeout(() => socket.destroy(), 5000)
    socket.on('data', (chunk) => {
      if (answer === '' && body !== undefined) socket.write(body)
      answer += chunk.toString('latin1')
    })
    socket.on('error', () => undefined)
    socket.on('close', () => {
      clearTimeout(timer)
      resolve(answer)
    })
    socket.write(head)
  })
}
