import { execFile } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import * as tar from 'tar'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Answer, type RunEvent, TheirClient } from './helpers/compat-client.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// The hosted agent-session product's own clients (SDK and CLI) against Cairn's compat API: requests
// as their source sends them, run streams read as their SDK reads them (test/helpers/compat-client.ts).

const execFileAsync = promisify(execFile)
const PREFIX = '/superserve'

// A shim-mode agent as their zero-config deploy ships one: a script reading each message on stdin.
const SHIM_AGENT = `import os
while True:
    line = input()
    if line.startswith("remember "):
        with open("/workspace/notes.txt", "w") as f:
            f.write(line[len("remember "):])
        print("noted")
    elif line == "recall":
        print(open("/workspace/notes.txt").read())
    else:
        print("echo: " + line)
`

// A shim agent that reports a tool call, or fails its run when told to (Cairn's jsonl protocol,
// chosen with config.protocol).
const TOOL_AGENT = `import json, sys, time
def send(frame):
    sys.stdout.write(json.dumps(frame) + "\\n")
    sys.stdout.flush()
send({"type": "ready"})
for raw in sys.stdin:
    frame = json.loads(raw)
    if frame["content"] == "fail":
        send({"type": "error", "message": "the ledger is locked"})
        continue
    send({"type": "tool.start", "id": "t1", "name": "list_files", "input": {"path": "/workspace"}})
    time.sleep(0.05)
    send({"type": "tool.end", "id": "t1", "output": ["a"]})
    send({"type": "text", "content": "listed for " + frame["content"]})
    send({"type": "turn.done"})
`

async function tarballOf(files: Record<string, string>): Promise<Buffer> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'compat-agent-'))
  try {
    for (const [name, content] of Object.entries(files)) await writeFile(path.join(dir, name), content)
    const chunks: Buffer[] = []
    for await (const chunk of tar.c({ gzip: true, cwd: dir, portable: true }, Object.keys(files))) {
      chunks.push(chunk as Buffer)
    }
    return Buffer.concat(chunks)
  } finally {
    await rm(dir, { recursive: true, force: true })
  }
}

describe('compat: the hosted product’s SDK and CLI wire shapes against Cairn', () => {
  let t: TestServer
  let client: TheirClient
  /** How far the server's clock is set back (old sessions for the cleanup recipe). */
  let clockOffsetMs = 0
  let agentId = ''

  beforeAll(async () => {
    t = await startTestServer({
      server: { compatPrefix: PREFIX, clock: { now: () => Date.now() - clockOffsetMs } },
    })
    client = new TheirClient(`${t.url}${PREFIX}`, t.key)
  })
  afterAll(async () => {
    await t?.close()
  })

  it('is off unless a prefix is given: the routes answer 404 in Cairn’s own shape', async () => {
    const plain = await startTestServer()
    try {
      const response = await fetch(`${plain.url}${PREFIX}/v1/auth/validate`, {
        headers: { Authorization: `Bearer ${plain.key}` },
      })
      expect(response.status).toBe(404)
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe('not_found')
    } finally {
      await plain.close()
    }
  })

  it('is in Cairn’s OpenAPI document under its prefix, tagged compat', async () => {
    const document = await t.api.call('GET', '/v1/openapi.json')
    const paths = document.body.paths as Record<string, Record<string, { tags?: string[] }>>
    const compat = Object.keys(paths).filter((p) => p.startsWith(PREFIX))
    expect(compat).toEqual(
      expect.arrayContaining([`${PREFIX}/v1/agents`, `${PREFIX}/v1/sessions/{id}/messages`]),
    )
    for (const path of compat)
      for (const operation of Object.values(paths[path] ?? {})) expect(operation.tags).toEqual(['compat'])
    const deploy = paths[`${PREFIX}/v1/agents`]?.post as { requestBody?: { content: object } }
    expect(Object.keys(deploy.requestBody?.content ?? {})).toEqual(['multipart/form-data'])
    // The run's answers are documented: its stream, each event's data by name, and its errors.
    const send = paths[`${PREFIX}/v1/sessions/{id}/messages`]?.post as unknown as {
      responses: Record<string, { content: Record<string, Record<string, { anyOf: { title: string }[] }>> }>
    }
    const stream = send.responses['200']?.content['text/event-stream']?.['x-cairn-event-data']
    expect(stream?.anyOf.map((member) => member.title)).toEqual(
      expect.arrayContaining(['run.started', 'message.delta', 'run.completed', 'run.failed']),
    )
    expect(Object.keys(send.responses)).toEqual(expect.arrayContaining(['400', '404', '409', '415']))
  })

  it('answers what is refused before a route in their error shape too: a bad path, no route, an unknown method (405 with Allow)', async () => {
    const raw = (method: string, route: string) =>
      fetch(`${t.url}${PREFIX}/v1${route}`, { method, headers: { authorization: `Bearer ${t.key}` } })
    const shaped = {
      detail: expect.any(String),
      message: expect.any(String),
      request_id: expect.stringMatching(/^req_/),
    }
    const badPath = await raw('GET', '/agents/%ff')
    expect(badPath.status).toBe(400)
    expect(await badPath.json()).toMatchObject({ ...shaped, code: 'bad_request' })
    const long = await raw('GET', `/agents/${'z'.repeat(1100)}`)
    expect(long.status).toBe(400)
    expect(await long.json()).toMatchObject({ ...shaped, code: 'bad_request' })
    const method = await raw('PUT', '/agents')
    expect(method.status).toBe(405)
    expect(method.headers.get('allow')).toBe('GET, HEAD, POST')
    expect(await method.json()).toMatchObject({ ...shaped, code: 'method_not_allowed' })
    const none = await raw('GET', '/nowhere')
    expect(none.status).toBe(404)
    expect(await none.json()).toMatchObject({ ...shaped, code: 'not_found' })
  })

  it('auth: /auth/validate and /auth/me with a Cairn key; errors carry a top-level detail and message', async () => {
    const valid = await client.call('GET', '/auth/validate')
    expect(valid.status).toBe(200)
    expect(valid.json.valid).toBe(true)
    const me = await client.call('GET', '/auth/me')
    expect(me.status).toBe(200)
    expect(me.json).toMatchObject({ id: 'tnt_default', email: expect.stringMatching(/^key_/) })

    const anonymous = await new TheirClient(client.baseUrl, undefined).call('GET', '/auth/validate')
    expect(anonymous.status).toBe(401)
    expect(anonymous.json.detail).toMatch(/missing API key/)
    expect(anonymous.json.message).toBe(anonymous.json.detail)
    const wrong = await new TheirClient(client.baseUrl, 'cairn_sk_wrong').call('GET', '/auth/me')
    expect(wrong.status).toBe(401)
    expect(wrong.json.detail).toBe('invalid API key')
  })

  it('deploys a shim agent from their multipart form and lists it in the {agents} envelope', async () => {
    const tarball = await tarballOf({ 'agent.py': SHIM_AGENT })
    // Their zero-config deploy: `superserve deploy agent.py` → command "python agent.py", mode shim.
    const deployed = await client.deploy(
      'shim-agent',
      'python agent.py',
      {
        name: 'shim-agent',
        command: 'python agent.py',
        entrypoint: 'agent.py',
        mode: 'shim',
      },
      tarball,
    )
    expect(deployed.status, JSON.stringify(deployed.json)).toBe(201)
    expect(deployed.json).toMatchObject({
      name: 'shim-agent',
      // Their `python` is Python 3: the compat deploy runs it as python3 (docs/compat.md).
      command: 'python3 agent.py',
      deps_status: 'ready',
      deps_error: null,
      environment_keys: [],
      required_secrets: [],
    })
    agentId = deployed.json.id as string
    expect(agentId).toMatch(/^agt_/)

    const list = await client.call('GET', '/agents')
    expect(list.status).toBe(200)
    expect((list.json.agents as { name: string }[]).map((a) => a.name)).toContain('shim-agent')
    const one = await client.call('GET', `/agents/${agentId}`)
    expect(one.json.created_at).toMatch(/^\d{4}-\d\d-\d\dT/)
  })

  it('deploys mode: http (their `deploy server.py --port 8000`) and runs it: each message a POST /run {prompt}', async () => {
    // Their docs' HTTP-mode server (FastAPI there; the standard library here): POST /run with
    // {"prompt"} answered {"response"}, on the port given to their deploy.
    const tarball = await tarballOf({
      'server.py': `import json
from http.server import BaseHTTPRequestHandler, HTTPServer

class Run(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/run":
            self.send_error(404)
            return
        prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
        body = json.dumps({"response": "You said: " + prompt}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

HTTPServer(("0.0.0.0", 8000), Run).serve_forever()
`,
    })
    const deployed = await client.deploy(
      'http-agent',
      'python server.py',
      { name: 'http-agent', command: 'python server.py', entrypoint: 'server.py', mode: 'http', port: 8000 },
      tarball,
    )
    expect(deployed.status, JSON.stringify(deployed.json)).toBe(201)
    const session = await client.call('POST', '/sessions', { json: { agent_id: 'http-agent' } })
    expect(session.status, JSON.stringify(session.json)).toBe(201)
    const run = await client.stream(session.json.id as string, 'hello')
    expect(run.status).toBe(200)
    expect(run.result).toMatchObject({ text: 'You said: hello', finishReason: 'completed' })
    expect(run.result.duration).toBeGreaterThan(0)
    expect(run.events.at(-1)).toMatchObject({ type: 'run.completed', data: { text: 'You said: hello' } })
    const again = await client.stream(session.json.id as string, 'twice')
    expect(again.result.text).toBe('You said: twice')
    expect((await client.call('DELETE', '/agents/http-agent')).status).toBe(200)
  })

  it('refuses mode: http without the port it serves on, naming the field', async () => {
    const tarball = await tarballOf({ 'server.py': 'print(1)\n' })
    const answer = await client.deploy('http-portless', 'python server.py', { mode: 'http' }, tarball)
    expect(answer.status).toBe(400)
    expect(answer.json.code).toBe('invalid_manifest')
    expect(answer.json.detail).toMatch(/mode http needs config\.port/)
    expect((await client.call('GET', '/agents/http-portless')).status).toBe(404)
  })

  it('refuses a deploy that is not multipart, or misses a field, with detail', async () => {
    const notForm = await client.call('POST', '/agents', { json: { name: 'x' } })
    expect(notForm.status).toBe(415)
    expect(notForm.json.detail).toMatch(/multipart/)
    const form = new FormData()
    form.append('name', 'no-file')
    form.append('command', 'python a.py')
    const noFile = await client.call('POST', '/agents', { formData: form })
    expect(noFile.status).toBe(400)
    expect(noFile.json.detail).toMatch(/file/)
    const notTar = await client.deploy(
      'not-tar',
      'python a.py',
      {},
      Buffer.from('PK\u0003\u0004 not a tarball'),
    )
    expect(notTar.status).toBe(400)
    expect(notTar.json.code).toBe('invalid_archive')
    const badName = await client.deploy(
      'My_Agent',
      'python a.py',
      {},
      await tarballOf({ 'a.py': 'print(1)\n' }),
    )
    expect(badName.status).toBe(400)
    expect(badName.json.detail).toMatch(/name.*lower-case/)
    const badConfig = await client.deploy(
      'x',
      'python a.py',
      { protocol: 'smtp' },
      await tarballOf({ 'a.py': '' }),
    )
    expect(badConfig.status).toBe(400)
    expect(badConfig.json.detail).toMatch(/^config\.protocol/)
  })

  it('sessions: create (seconds), run, stream, list, resolve, end, resume, delete', async () => {
    const created = await client.call('POST', '/sessions', {
      json: { agent_id: agentId, title: 'compat run', idle_timeout_seconds: 29 * 60 },
    })
    expect(created.status, JSON.stringify(created.json)).toBe(201)
    expect(created.json).toMatchObject({
      agent_id: agentId,
      agent_name: 'shim-agent',
      status: 'idle',
      title: 'compat run',
      message_count: 0,
      idle_timeout_seconds: 1740,
    })
    const id = created.json.id as string
    // Seconds became milliseconds in Cairn's own view of the session.
    const own = await t.api.call('GET', `/v1/sessions/${id}`)
    expect(own.body.policy.idleTimeoutMs).toBe(1_740_000)

    const first = await client.stream(id, 'remember 42')
    expect(first.status).toBe(200)
    const types = first.events.map((e) => e.type)
    expect(types[0]).toBe('run.started')
    expect(types.at(-1), JSON.stringify(first.events.at(-1))).toBe('run.completed')
    // Their SDK's session.run(): the agent's answer, and the run's duration from run.completed.
    expect(first.result).toEqual({
      text: 'noted\n',
      toolCalls: [],
      finishReason: 'completed',
      duration: expect.any(Number),
      maxTurnsReached: false,
      error: undefined,
    })
    expect(first.result.duration).toBeGreaterThan(0)
    // Cairn's own transcript holds the same answer.
    const transcript = await t.api.call('GET', `/v1/sessions/${id}/messages`)
    expect(JSON.stringify(transcript.body)).toContain('noted')

    const got = await client.call('GET', `/sessions/${id}`)
    expect(got.json.message_count).toBe(2)
    expect(Date.parse(got.json.last_activity_at as string)).toBeGreaterThan(Date.now() - 60_000)

    const listed = await client.call('GET', '/sessions', { params: { limit: '20', agent_id: agentId } })
    expect(listed.status).toBe(200)
    expect(Object.keys(listed.json)).toEqual(['sessions'])
    expect((listed.json.sessions as { id: string }[]).map((s) => s.id)).toContain(id)
    const byName = await client.call('GET', '/sessions', { params: { agent_id: 'shim-agent' } })
    expect((byName.json.sessions as unknown[]).length).toBe((listed.json.sessions as unknown[]).length)

    // Their CLI resolves every short ID: it strips `ses_` and asks for ?id_prefix=.
    const clean = id.replace('ses_', '').slice(0, 8)
    expect((await client.call('GET', '/sessions/resolve', { params: { id_prefix: clean } })).json).toEqual({
      ids: [id],
    })
    expect((await client.call('GET', '/sessions/resolve', { params: { id_prefix: 'zzzz' } })).json).toEqual({
      ids: [],
    })

    const ended = await client.call('POST', `/sessions/${id}/end`)
    expect(ended.status).toBe(200)
    expect(ended.json.status).toBe('ended')
    const endedList = await client.call('GET', '/sessions', {
      params: { status: 'ended', agent_id: agentId },
    })
    expect((endedList.json.sessions as { id: string }[]).map((s) => s.id)).toEqual([id])

    const resumed = await client.call('POST', `/sessions/${id}/resume`)
    expect(resumed.status).toBe(200)
    expect(resumed.json.status).toBe('idle')
    const recalled = await client.stream(id, 'recall')
    expect(recalled.result.text).toBe('42\n')

    const deleted = await client.call('DELETE', `/sessions/${id}`)
    expect(deleted.status).toBe(200)
    expect(deleted.json).toEqual({ id, deleted: true })
    const gone = await client.call('GET', `/sessions/${id}`)
    expect(gone.status).toBe(404)
    expect(gone.json.detail).toBe(`No session found matching '${id}'`)
    expect(gone.json.message).toBe(gone.json.detail)
  })

  it('tool calls stream as tool.start {tool, input} and tool.end {duration_ms}', async () => {
    const tarball = await tarballOf({ 'agent.py': TOOL_AGENT })
    const deployed = await client.deploy(
      'tool-agent',
      'python3 agent.py',
      { mode: 'shim', protocol: 'jsonl' },
      tarball,
    )
    expect(deployed.status, JSON.stringify(deployed.json)).toBe(201)
    // Their SDK's defaults: no title, a 30-day idle timeout; their CLI titles a session with its prompt.
    const session = await client.call('POST', '/sessions', {
      json: { agent_id: 'tool-agent', title: 'p'.repeat(300), idle_timeout_seconds: 30 * 24 * 60 * 60 },
    })
    expect(session.status, JSON.stringify(session.json)).toBe(201)
    expect(session.json.idle_timeout_seconds).toBe(2_592_000)
    expect(session.json.title).toBe('p'.repeat(200))
    const sessionId = session.json.id as string
    const run = await client.stream(sessionId, 'hello')
    const start = run.events.find((e) => e.type === 'tool.start')
    const end = run.events.find((e) => e.type === 'tool.end')
    expect(start?.data).toMatchObject({ tool: 'list_files', input: { path: '/workspace' } })
    expect(start?.data.name).toBeUndefined()
    // Measured by the server between the two frames (a loaded machine may read both at once).
    expect(end?.data.duration_ms).toEqual(expect.any(Number))
    expect(end?.data.duration_ms).toBeGreaterThanOrEqual(0)
    expect(end?.data.durationMs).toBeUndefined()
    // Their SDK's result: the tool call by its name and input (not `unknown`), the text, the duration.
    expect(run.result.toolCalls).toEqual([
      { name: 'list_files', input: { path: '/workspace' }, duration: end?.data.duration_ms },
    ])
    expect(run.result.text).toBe('listed for hello')
    expect(run.result.finishReason).toBe('completed')
    expect(run.result.duration).toBeGreaterThan(0)

    // A failed run: their stream's run-failed event carries the agent's own message.
    const failed = await client.stream(sessionId, 'fail')
    expect(failed.status).toBe(200)
    expect(failed.result.finishReason).toBe('failed')
    expect(failed.result.error).toBe('the ledger is locked')
    expect(failed.events.at(-1)).toMatchObject({
      type: 'run.failed',
      data: { error: { code: 'agent_crashed', message: 'the ledger is locked' } },
    })
    expect((await client.call('DELETE', '/agents/tool-agent')).status).toBe(200)
  })

  it('frames a run as the agent-era clients read it: the type on `event:`, the payload alone on `data:`', async () => {
    const session = await client.call('POST', '/sessions', { json: { agent_id: 'shim-agent' } })
    const run = await client.stream(session.json.id as string, 'framing')
    const blocks = run.body.split('\n\n').filter((b) => b !== '')
    expect(blocks.length).toBeGreaterThanOrEqual(3)
    for (const block of blocks) {
      const [event, data, ...rest] = block.split('\n')
      expect(rest).toEqual([])
      const type = event?.replace(/^event: /, '')
      const payload = JSON.parse(data?.replace(/^data: /, '') ?? '') as Record<string, unknown>
      // The payload is the event's data: no {type, data} envelope inside it.
      expect(payload.type, block).toBeUndefined()
      expect(payload.data, block).toBeUndefined()
      if (type === 'message.delta') expect(payload.content).toEqual(expect.any(String))
    }
    expect(run.result.text).toBe('echo: framing\n')
  })

  it('frames a run as {type, data} envelopes on `data:` lines only when asked: ?format=envelope', async () => {
    const session = await client.call('POST', '/sessions', { json: { agent_id: 'shim-agent' } })
    const id = session.json.id as string
    const run = await client.stream(id, 'wrapped', { format: 'envelope' })
    expect(run.status).toBe(200)
    const envelopes = run.body
      .split('\n')
      .filter((line) => line.startsWith('data: '))
      .map((line) => JSON.parse(line.slice(6)) as RunEvent)
    expect(envelopes[0]?.type).toBe('run.started')
    expect(envelopes.at(-1)).toMatchObject({ type: 'run.completed', data: { text: 'echo: wrapped\n' } })
    const text = envelopes.filter((e) => e.type === 'message.delta').map((e) => e.data.content)
    expect(text.join('')).toBe('echo: wrapped\n')

    const refused = await client.request('POST', `/sessions/${id}/messages`, {
      json: { prompt: 'x' },
      params: { format: 'jsonl' },
    })
    expect(refused.status).toBe(400)
    expect(((await refused.json()) as { detail: string }).detail).toMatch(/format/)
  })

  it('errors: unknown session, bad body, unknown agent — all with top-level detail', async () => {
    const missing = await client.call('GET', '/sessions/ses_doesnotexist')
    expect(missing.status).toBe(404)
    expect(missing.json).toMatchObject({ code: 'session_not_found', detail: expect.any(String) })
    const badBody = await client.call('POST', '/sessions', { json: { agent: 'shim-agent' } })
    expect(badBody.status).toBe(400)
    expect(badBody.json.detail).toMatch(/agent/)
    const noAgent = await client.call('POST', '/sessions', { json: { agent_id: 'nope' } })
    expect(noAgent.status).toBe(404)
    expect(noAgent.json.detail).toMatch(/nope/)
  })

  it('refuses a wrongly typed body field with 400 naming it, and creates, sends or sets nothing', async () => {
    const count = async () =>
      ((await client.call('GET', '/sessions', { params: { limit: '500' } })).json.sessions as unknown[])
        .length
    const sessionsBefore = await count()
    const refused = (answer: Answer, field: string) => {
      expect(answer.status, JSON.stringify(answer.json)).toBe(400)
      expect(answer.json).toMatchObject({ code: 'validation_failed' })
      expect(answer.json.detail).toContain(`body/${field} must be`)
    }
    for (const [field, value] of [
      ['idle_timeout_seconds', '60'],
      ['idle_timeout_seconds', [60]],
      ['idle_timeout_seconds', true],
      ['title', 5],
      ['title', false],
      ['agent_id', 5],
    ] as const) {
      refused(await client.call('POST', '/sessions', { json: { agent_id: agentId, [field]: value } }), field)
    }
    expect(await count()).toBe(sessionsBefore)
    const session = await client.call('POST', '/sessions', { json: { agent_id: agentId } })
    expect(session.status).toBe(201)
    const id = session.json.id as string
    for (const prompt of [false, 42, null, ['hi']]) {
      refused(await client.call('POST', `/sessions/${id}/messages`, { json: { prompt } }), 'prompt')
    }
    expect((await client.call('GET', `/sessions/${id}`)).json.message_count).toBe(0)
    refused(
      await client.call('PATCH', `/agents/${agentId}/secrets`, { json: { secrets: { API_TOKEN: 7 } } }),
      'secrets/API_TOKEN',
    )
    expect((await client.call('GET', `/agents/${agentId}/secrets`)).json).toEqual({ keys: [] })
    expect((await client.call('DELETE', `/sessions/${id}`)).status).toBe(200)
  })

  it('secrets: PATCH sets, GET lists keys, DELETE removes', async () => {
    const set = await client.call('PATCH', `/agents/${agentId}/secrets`, {
      json: { secrets: { API_TOKEN: 's3cr3t' } },
    })
    expect(set.status).toBe(200)
    expect(set.json).toEqual({ keys: ['API_TOKEN'] })
    expect((await client.call('GET', '/agents/shim-agent/secrets')).json).toEqual({ keys: ['API_TOKEN'] })
    expect((await client.call('GET', `/agents/${agentId}`)).json.environment_keys).toEqual(['API_TOKEN'])
    expect(JSON.stringify((await client.call('GET', `/agents/${agentId}/secrets`)).json)).not.toContain(
      's3cr3t',
    )
    const removed = await client.call('DELETE', `/agents/${agentId}/secrets/API_TOKEN`)
    expect(removed.json).toEqual({ keys: [] })
  })

  it('the docs’ cleanup recipe, end to end: sessions idle since before 2025-02-01 are deleted, newer ones kept', async () => {
    clockOffsetMs = Date.now() - Date.parse('2025-01-10T12:00:00Z')
    const old: string[] = []
    for (const title of ['old one', 'old two']) {
      const created = await client.call('POST', '/sessions', { json: { agent_id: agentId, title } })
      expect(created.json.last_activity_at).toMatch(/^2025-01-10T/)
      old.push(created.json.id as string)
    }
    clockOffsetMs = 0
    const fresh = (await client.call('POST', '/sessions', { json: { agent_id: agentId, title: 'new' } })).json
      .id as string

    // `superserve sessions list --json` prints the `sessions` array of this answer, so the docs'
    // `.[]` over the CLI's output is `.sessions[]` over the wire.
    const script = [
      'set -euo pipefail',
      'curl -sf -H "Authorization: Bearer $KEY" "$BASE/v1/sessions?agent_id=$AGENT" |',
      `  jq -r '.sessions[] | select(.last_activity_at < "2025-02-01") | .id' |`,
      '  xargs -I {} curl -sf -X DELETE -H "Authorization: Bearer $KEY" "$BASE/v1/sessions/{}"',
    ].join('\n')
    await execFileAsync('bash', ['-c', script], {
      env: { ...process.env, KEY: t.key, BASE: client.baseUrl, AGENT: agentId },
    })
    const left = (await client.call('GET', '/sessions', { params: { agent_id: agentId } })).json.sessions as {
      id: string
    }[]
    const ids = left.map((s) => s.id)
    expect(ids).toContain(fresh)
    for (const id of old) expect(ids).not.toContain(id)
  })

  it('keys: a read-only key reads but cannot write; another tenant sees none of it', async () => {
    const reader = (await t.api.call('POST', '/v1/keys', { role: 'read', name: 'compat reader' })).body
      .key as string
    const asReader = new TheirClient(client.baseUrl, reader)
    expect((await asReader.call('GET', '/sessions', { params: { agent_id: agentId } })).status).toBe(200)
    const refused = await asReader.call('POST', '/sessions', { json: { agent_id: agentId } })
    expect(refused.status).toBe(403)
    expect(refused.json.detail).toBe('this API key is read-only')
    expect(
      (await asReader.call('PATCH', `/agents/${agentId}/secrets`, { json: { secrets: { A: 'b' } } })).status,
    ).toBe(403)

    const other = (await t.api.call('POST', '/v1/keys', { tenant: 'tnt_other', name: 'other tenant' })).body
      .key as string
    const asOther = new TheirClient(client.baseUrl, other)
    expect((await asOther.call('GET', '/agents')).json).toEqual({ agents: [] })
    expect((await asOther.call('GET', `/agents/${agentId}`)).status).toBe(404)
    expect((await asOther.call('POST', '/sessions', { json: { agent_id: agentId } })).status).toBe(404)
    expect((await asOther.call('GET', '/sessions')).json).toEqual({ sessions: [] })
    const mine = (await client.call('GET', '/sessions', { params: { agent_id: agentId } })).json.sessions as {
      id: string
    }[]
    const someone = mine[0]?.id as string
    expect((await asOther.call('GET', `/sessions/${someone}`)).status).toBe(404)
    expect((await asOther.call('POST', `/sessions/${someone}/end`)).status).toBe(404)
    expect(
      (await asOther.call('GET', '/sessions/resolve', { params: { id_prefix: someone.slice(4) } })).json,
    ).toEqual({
      ids: [],
    })
  })

  it('deletes the agent', async () => {
    const deleted = await client.call('DELETE', `/agents/${agentId}`)
    expect(deleted.status).toBe(200)
    const gone = await client.call('GET', `/agents/${agentId}`)
    expect(gone.status).toBe(404)
    expect(gone.json.detail).toMatch(/agent/i)
  })
})
