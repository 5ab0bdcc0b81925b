import path from 'node:path'
import type { StreamEvent } from '@cairn/protocol'
import { SseParser } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

// `protocol: http`: the agent serves HTTP inside its sandbox and each message is a POST to it.
// Every agent here is a real Python http.server in a real sandbox, reached through the port relay.

/** An http agent whose POST handler is `body` (Python, indented into a do_POST(self, prompt)). */
function httpAgent(
  name: string,
  handler: string,
  yaml: { http?: string; extra?: string } = {},
): Record<string, string> {
  return {
    'cairn.yaml': `name: ${name}\ncommand: python3 agent.py\nprotocol: http\nhttp: ${yaml.http ?? '{ port: 8080 }'}\n${yaml.extra ?? ''}`,
    'agent.py': `import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Agent(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, content_type, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = message["prompt"]
${handler
  .split('\n')
  .map((line) => `        ${line}`)
  .join('\n')}

ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Agent).serve_forever()
`,
  }
}

describe('http agents', () => {
  let t: TestServer

  beforeAll(async () => {
    t = await startTestServer()
  }, 60_000)
  afterAll(async () => {
    await t?.close()
  })

  async function deploy(files: Record<string, string>) {
    const res = await t.api.deploy(await makeProject(files))
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    return res.body
  }

  it('deploys the example, streams its SSE frames as events and keeps its workspace between messages', async () => {
    const res = await t.api.deploy(path.join(EXAMPLES, 'http-server'))
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    expect(res.body.revision.protocol).toBe('http')
    const session = await t.api.createSession('http-server')
    const first = await t.api.send(session.id, 'remember the milk')
    expect(first.terminal?.type, JSON.stringify(first.events)).toBe('run.completed')
    expect(first.text).toBe('noted')
    const types = first.events.map((e) => e.type)
    expect(types).toContain('status')
    const toolStart = first.events.find((e) => e.type === 'tool.start')
    expect(toolStart).toMatchObject({ name: 'write_notes', input: { path: '/workspace/notes.txt' } })
    expect(types.indexOf('tool.start')).toBeLessThan(types.indexOf('tool.end'))
    const second = await t.api.send(session.id, 'recall')
    expect(second.text).toBe('the milk')
    expect(second.events[0]).toMatchObject({ type: 'run.started', coldStart: false })
    const plain = await t.api.send(session.id, 'line one\nline two')
    // A request body carries the prompt whole: newlines stay (unlike stdio's one line per message).
    expect(plain.text).toBe('you said: line one\nline two')
  }, 60_000)

  it('streams a text/plain answer as it is written, before the agent has finished', async () => {
    await deploy(
      httpAgent(
        'http-slow-text',
        `self.send_response(200)
self.send_header("Content-Type", "text/plain; charset=utf-8")
self.send_header("Connection", "close")
self.end_headers()
self.wfile.write(("first:" + prompt).encode())
self.wfile.flush()
time.sleep(1.5)
self.wfile.write(" second".encode())
self.wfile.flush()
self.close_connection = True`,
      ),
    )
    const session = await t.api.createSession('http-slow-text')
    const res = await fetch(`${t.url}/v1/sessions/${session.id}/messages`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'go' }),
    })
    const parser = new SseParser()
    const seen: { event: StreamEvent; at: number }[] = []
    const reader = res.body?.getReader()
    const decoder = new TextDecoder()
    for (;;) {
      const chunk = await reader?.read()
      if (!chunk || chunk.done) break
      for (const message of parser.push(decoder.decode(chunk.value, { stream: true })))
        seen.push({ event: JSON.parse(message.data) as StreamEvent, at: Date.now() })
    }
    const deltas = seen.filter((s) => s.event.type === 'message.delta')
    const done = seen.find((s) => s.event.type === 'run.completed')
    expect(done?.event).toMatchObject({ text: 'first:go second' })
    expect(deltas[0]?.event).toMatchObject({ content: 'first:go' })
    // The first piece reached the client while the agent was still sleeping before the second.
    expect((done?.at ?? 0) - (deltas[0]?.at ?? 0)).toBeGreaterThan(1000)
  }, 60_000)

  it("takes their JSON answer {response} as the reply (Superserve's HTTP mode shape)", async () => {
    await deploy(
      httpAgent(
        'http-json',
        `self.reply(200, "application/json", json.dumps({"response": "You said: " + prompt}))`,
      ),
    )
    const session = await t.api.createSession('http-json')
    const res = await t.api.send(session.id, 'hello')
    expect(res.terminal).toMatchObject({ type: 'run.completed', text: 'You said: hello' })
  }, 60_000)

  it('reads an ndjson answer as frames: tool calls, text, and an error frame that fails the turn', async () => {
    await deploy(
      httpAgent(
        'http-ndjson',
        `frames = [{"type": "tool.start", "id": "t1", "name": "search", "input": {"q": prompt}},
          {"type": "tool.end", "id": "t1", "output": ["hit"]}]
if prompt == "fail":
    frames.append({"type": "error", "message": "the model refused"})
else:
    frames += [{"type": "text", "content": "found "}, {"type": "text", "content": prompt}]
self.reply(200, "application/x-ndjson", "".join(json.dumps(f) + "\\n" for f in frames))`,
      ),
    )
    const session = await t.api.createSession('http-ndjson')
    const ok = await t.api.send(session.id, 'cats')
    expect(ok.terminal).toMatchObject({ type: 'run.completed', text: 'found cats' })
    expect(ok.events.find((e) => e.type === 'tool.start')).toMatchObject({
      name: 'search',
      input: { q: 'cats' },
    })
    expect(ok.events.find((e) => e.type === 'tool.end')).toMatchObject({ output: ['hit'] })
    const failed = await t.api.send(session.id, 'fail')
    expect(failed.terminal).toMatchObject({
      type: 'run.failed',
      error: { code: 'agent_crashed', message: 'the model refused' },
    })
  }, 60_000)

  it('an HTTP error status fails the turn with its body and keeps the agent for the next message', async () => {
    await deploy(
      httpAgent(
        'http-errors',
        `if prompt == "boom":
    self.reply(500, "text/plain", "database unreachable")
else:
    self.reply(200, "text/plain", "fine")`,
      ),
    )
    const session = await t.api.createSession('http-errors')
    const failed = await t.api.send(session.id, 'boom')
    expect(failed.terminal).toMatchObject({ type: 'run.failed', error: { code: 'agent_crashed' } })
    const message = failed.terminal?.type === 'run.failed' ? failed.terminal.error.message : ''
    expect(message).toContain('HTTP 500')
    expect(message).toContain('database unreachable')
    const next = await t.api.send(session.id, 'again')
    expect(next.text).toBe('fine')
    expect(next.events[0]).toMatchObject({ type: 'run.started', coldStart: false })
  }, 60_000)

  it('an agent serving another path is told the path it must serve (agent_protocol_error)', async () => {
    await deploy(
      httpAgent(
        'http-wrong-path',
        `if self.path != "/run":
    self.reply(404, "text/plain", "no route " + self.path)
else:
    self.reply(200, "text/plain", "ok")`,
        { http: '{ port: 8080, path: /chat }' },
      ),
    )
    const session = await t.api.createSession('http-wrong-path')
    const res = await t.api.send(session.id, 'hi')
    expect(res.terminal).toMatchObject({ type: 'run.failed', error: { code: 'agent_protocol_error' } })
    const message = res.terminal?.type === 'run.failed' ? res.terminal.error.message : ''
    expect(message).toContain('HTTP 404 to POST /chat')
    expect(message).toContain('no route /chat')
  }, 60_000)

  it('an agent that crashes on a message fails the turn as agent_crashed, with the crash from stderr', async () => {
    await deploy(
      httpAgent(
        'http-crash',
        `sys.stderr.write("RuntimeError: model client exploded\\n")\nsys.stderr.flush()\nos._exit(3)`,
      ),
    )
    const session = await t.api.createSession('http-crash')
    const res = await t.api.send(session.id, 'hi')
    expect(res.terminal).toMatchObject({ type: 'run.failed', error: { code: 'agent_crashed' } })
    const message = res.terminal?.type === 'run.failed' ? res.terminal.error.message : ''
    expect(message).toContain('exited with code 3')
    expect(message).toContain('model client exploded')
    const got = await t.api.call('GET', `/v1/sessions/${session.id}`)
    expect(got.body.status).toBe('failed')
  }, 60_000)

  it('an agent slower than its turn timeout is stopped with timeout', async () => {
    await deploy(
      httpAgent('http-slow', `time.sleep(30)\nself.reply(200, "text/plain", "late")`, {
        extra: 'limits: { turnTimeoutMs: 1500 }\n',
      }),
    )
    const session = await t.api.createSession('http-slow')
    const res = await t.api.send(session.id, 'hi')
    expect(res.terminal).toMatchObject({ type: 'run.failed', error: { code: 'timeout' } })
  }, 60_000)

  it('an agent that never listens on its port fails with port_unreachable naming the port', async () => {
    await deploy({
      'cairn.yaml':
        'name: http-deaf\ncommand: python3 -c "import time; time.sleep(60)"\nprotocol: http\nhttp: { port: 8080, readyTimeoutMs: 800 }\n',
    })
    const session = await t.api.createSession('http-deaf')
    const res = await t.api.send(session.id, 'hi')
    expect(res.terminal).toMatchObject({ type: 'run.failed', error: { code: 'port_unreachable' } })
    const message = res.terminal?.type === 'run.failed' ? res.terminal.error.message : ''
    expect(message).toContain('did not listen on port 8080')
  }, 60_000)

  it('refuses an http agent without its port, http: under another protocol, and a forwarder port', async () => {
    const cases: [string, string][] = [
      ['name: a1\ncommand: python3 a.py\nprotocol: http\n', 'protocol http needs the port'],
      ['name: a2\ncommand: python3 a.py\nhttp: { port: 8000 }\n', 'http: is for protocol: http agents'],
      ['name: a3\ncommand: python3 a.py\nprotocol: http\nhttp: { port: 3128 }\n', "Cairn's egress forwarder"],
      ['name: a4\ncommand: python3 a.py\nprotocol: http\nhttp: { port: 8000, path: run }\n', 'http.path'],
    ]
    for (const [yaml, says] of cases) {
      const res = await t.api.deploy(await makeProject({ 'cairn.yaml': yaml, 'a.py': '' }))
      expect(res.status, yaml).toBe(400)
      expect(res.body.error.code).toBe('invalid_manifest')
      expect(res.body.error.message).toContain(says)
    }
  }, 60_000)
})
