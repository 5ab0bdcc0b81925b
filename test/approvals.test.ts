import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnCli } from './helpers/cli.js'
import { makeProject, REVIEWER_PROJECT } from './helpers/projects.js'
import { Api, startTestServer, type TestServer } from './helpers/server.js'

// Human review (docs/approvals.md) against a real server: a jsonl and an http agent ask for
// approval, a person answers through the API, and a turn carries the answer to the agent (warm,
// cold after keep-warm, after a restart of the server). One server at a time, on one data dir.

/** Asks like REVIEWER_PROJECT's agent (`ask …` writes review.txt and asks), over HTTP. */
const HTTP_AGENT = `import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Agent(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        m = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        a = m.get("approval")
        if a:
            frames = [{"type": "text", "content": "got %s %s %s" % (a["id"], a["decision"], a["note"])}]
        elif m["prompt"].startswith("ask"):
            open("review.txt", "w").write(m["prompt"])
            frames = [{"type": "approval.request", "summary": "deploy to production"}]
        else:
            frames = [{"type": "text", "content": "echo " + m["prompt"]}]
        data = "".join(json.dumps(f) + "\\n" for f in frames).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Agent).serve_forever()
`

let dataDir = ''
let t: TestServer
let readOnly: Api

/** Starts the server on the data dir; started again, it has no new admin key: the first one is kept. */
async function start(): Promise<void> {
  const key = t?.key
  t = await startTestServer({ dataDir })
  if (key) t.api = new Api(t.url, key)
  readOnly = new Api(t.url, readOnly?.key ?? '')
}

beforeAll(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-approvals-'))
  await start()
  const jsonl = await makeProject(REVIEWER_PROJECT)
  const http = await makeProject({
    'cairn.yaml': 'name: reviewed-http\ncommand: python3 agent.py\nprotocol: http\nhttp: { port: 8080 }\n',
    'agent.py': HTTP_AGENT,
  })
  for (const dir of [jsonl, http]) expect((await t.api.deploy(dir)).status).toBe(201)
  const ro = await t.api.call('POST', '/v1/keys', { role: 'read', name: 'reviewer-viewer' })
  readOnly = new Api(t.url, ro.body.key)
  expect(ro.body.key).toBeTruthy()
}, 60_000)

afterAll(async () => {
  await t?.close()
  if (dataDir) await rm(dataDir, { recursive: true, force: true })
})

/** Sends `ask …` and answers the approval ID the turn's stream named. */
async function ask(sessionId: string): Promise<string> {
  const run = await t.api.send(sessionId, `ask ${sessionId}`)
  expect(run.terminal?.type, JSON.stringify(run.events)).toBe('run.completed')
  const requested = run.events.find((e) => e.type === 'approval.requested')
  if (requested?.type !== 'approval.requested')
    throw new Error(`no approval.requested: ${JSON.stringify(run)}`)
  expect(requested.approvalId).toMatch(/^apr_[0-9a-z]{20}$/)
  return requested.approvalId
}

const answer = (sessionId: string, approvalId: string, body: unknown, api: Api = t.api) =>
  api.call('POST', `/v1/sessions/${sessionId}/approvals/${approvalId}/answer`, body)

/** The reply of the session's turn `seq`, once that turn has ended (bounded: 20 s). */
async function replyOfTurn(sessionId: string, seq: number): Promise<{ response: string; sandboxId: string }> {
  for (let i = 0; i < 400; i++) {
    const turns = (await t.api.call('GET', `/v1/sessions/${sessionId}/turns`)).body.data as {
      seq: number
      status: string
      response: string
      sandboxId: string
    }[]
    const turn = turns.find((x) => x.seq === seq)
    if (turn && turn.status !== 'running') {
      expect(turn.status).toBe('completed')
      return turn
    }
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  throw new Error(`turn ${seq} of ${sessionId} did not end`)
}

describe('human review', () => {
  for (const agent of ['reviewed', 'reviewed-http']) {
    it(`${agent}: the request is shown with its review snapshot, a read-only key cannot answer, approve and deny reach the agent`, async () => {
      const { id } = await t.api.createSession(agent)
      const approvalId = await ask(id)
      const session = (await t.api.call('GET', `/v1/sessions/${id}`)).body
      expect(session).toMatchObject({ status: 'idle', approvalId })
      const listed = await readOnly.call('GET', `/v1/sessions/${id}/approvals`)
      expect(listed.status).toBe(200)
      const [request] = listed.body.data
      expect(request).toMatchObject({ id: approvalId, status: 'pending', turnId: expect.any(String) })
      expect(request.summary).toBe(agent === 'reviewed' ? 'delete build/' : 'deploy to production')
      if (agent === 'reviewed') expect(request.action).toEqual({ run: 'rm -rf build' })
      // The review snapshot holds what the agent wrote before it asked.
      const file = await t.api.call(
        'GET',
        `/v1/sessions/${id}/files/content?path=review.txt&snapshot=${request.snapshotId}`,
      )
      expect(file.status, JSON.stringify(file.body)).toBe(200)
      expect(file.body).toBe(`ask ${id}`)

      const refused = await answer(id, approvalId, { decision: 'approve' }, readOnly)
      expect(refused.status).toBe(403)
      expect(refused.body.error.code).toBe('forbidden')
      expect((await t.api.call('GET', `/v1/sessions/${id}/approvals/${approvalId}`)).body.status).toBe(
        'pending',
      )

      const approved = await answer(id, approvalId, { decision: 'approve', note: 'go ahead' })
      expect(approved.status, JSON.stringify(approved.body)).toBe(200)
      expect(approved.body).toMatchObject({
        status: 'approved',
        note: 'go ahead',
        answeredAt: expect.any(String),
      })
      expect(approved.body.deliveredTurnId).toMatch(/^trn_/)
      expect((await replyOfTurn(id, 2)).response).toBe(`got ${approvalId} approve go ahead`)
      expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.approvalId).toBeNull()
      const again = await answer(id, approvalId, { decision: 'deny' })
      expect(again.status).toBe(409)
      expect(again.body.error.code).toBe('approval_answered')

      const second = await ask(id)
      const denied = await answer(id, second, { decision: 'deny' })
      expect(denied.body.status).toBe('denied')
      expect((await replyOfTurn(id, 4)).response).toBe(`got ${second} deny None`)
    })
  }

  it('lists and answers from the CLI (cairn sessions approvals, approve, deny)', async () => {
    const { id } = await t.api.createSession('reviewed')
    const approvalId = await ask(id)
    const env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.api.key, CAIRN_CONFIG_DIR: dataDir }
    const shown = await spawnCli(['sessions', 'get', id], env).done
    expect(shown.stdout).toMatch(new RegExp(`Awaiting approval:\\s+${approvalId}`))
    const listed = await spawnCli(['sessions', 'approvals', id.slice(0, 12)], env).done
    expect(listed.code, listed.stderr).toBe(0)
    expect(listed.stdout).toMatch(new RegExp(`${approvalId}\\s+pending\\s+delete build/`))
    const denied = await spawnCli(['sessions', 'deny', id, approvalId, '--note', 'not today'], env).done
    expect(denied.code, denied.stderr).toBe(0)
    expect(denied.stdout).toContain(`${approvalId} denied`)
    expect((await replyOfTurn(id, 2)).response).toBe(`got ${approvalId} deny not today`)
    const readOnlyCli = await spawnCli(['sessions', 'approve', id, approvalId], {
      ...env,
      CAIRN_API_KEY: readOnly.key,
    }).done
    expect(readOnlyCli.code).not.toBe(0)
    expect(readOnlyCli.stderr).toMatch(/read-only/)
  })

  it('refuses every wrong answer body with validation_failed, an unknown request with approval_not_found, and lets one of two answers at once win', async () => {
    const { id } = await t.api.createSession('reviewed')
    const approvalId = await ask(id)
    const wrong: unknown[] = [
      {},
      { decision: 1 },
      { decision: 'maybe' },
      { decision: null },
      { decision: ['approve'] },
      { decision: 'approve', note: 5 },
      { decision: 'approve', note: null },
      { decision: 'approve', note: { text: 'x' } },
      { decision: 'approve', note: 'x'.repeat(4001) },
      { decision: 'approve', extra: true },
      [],
      '"approve"',
    ]
    for (const body of wrong) {
      const res = await answer(id, approvalId, body)
      expect(res.status, JSON.stringify(body)).toBe(400)
      expect(res.body.error.code, JSON.stringify(body)).toBe('validation_failed')
    }
    const unknown = await answer(id, 'apr_00000000000000000000', { decision: 'approve' })
    expect(unknown.status).toBe(404)
    expect(unknown.body.error.code).toBe('approval_not_found')
    expect((await t.api.call('GET', `/v1/sessions/${id}/approvals/${approvalId}`)).body.status).toBe(
      'pending',
    )

    const both = await Promise.all([
      answer(id, approvalId, { decision: 'approve', note: 'first' }),
      answer(id, approvalId, { decision: 'deny', note: 'second' }),
    ])
    expect(both.map((r) => r.status).sort()).toEqual([200, 409])
    const won = both.find((r) => r.status === 200)?.body
    const lost = both.find((r) => r.status === 409)?.body
    expect(lost.error.code).toBe('approval_answered')
    const decision = won.status === 'approved' ? 'approve' : 'deny'
    expect((await replyOfTurn(id, 2)).response).toBe(`got ${approvalId} ${decision} ${won.note}`)
  })

  it('refuses an answer named under another session of the tenant or a deleted one: no request or turn changes', async () => {
    // The answer's write matched the tenant and the request's ID only: under session A's path it
    // answered B's request (and sent its webhook), began a turn in A to tell it, then said 404.
    const a = (await t.api.createSession('reviewed')).id
    const b = (await t.api.createSession('reviewed')).id
    const [ofA, ofB] = [await ask(a), await ask(b)]
    for (const decision of ['approve', 'deny']) {
      const crossed = await answer(a, ofB, { decision })
      expect(crossed.status, JSON.stringify(crossed.body)).toBe(404)
      expect(crossed.body.error.code).toBe('approval_not_found')
    }
    expect((await t.api.call('GET', `/v1/sessions/${b}/approvals/${ofB}`)).body.status).toBe('pending')
    expect((await t.api.call('GET', `/v1/sessions/${a}/approvals/${ofA}`)).body.status).toBe('pending')
    for (const id of [a, b]) {
      const turns = (await t.api.call('GET', `/v1/sessions/${id}/turns`)).body.data
      expect(turns.map((turn: { seq: number }) => turn.seq)).toEqual([1])
    }
    // Each still takes its own answer.
    expect((await answer(b, ofB, { decision: 'approve' })).body.status).toBe('approved')
    expect((await replyOfTurn(b, 2)).response).toBe(`got ${ofB} approve None`)
    // A deleted session's request cannot reach its agent: the answer is refused, the request left as it was.
    expect((await t.api.call('DELETE', `/v1/sessions/${a}`)).status).toBe(200)
    const late = await answer(a, ofA, { decision: 'approve' })
    expect(late.status, JSON.stringify(late.body)).toBe(410)
    expect(late.body.error.code).toBe('session_deleted')
    expect((await t.api.call('GET', `/v1/sessions/${a}/approvals/${ofA}`)).body.status).toBe('pending')
  })

  it('delivers an answer that comes after keep-warm ended to the agent started again', async () => {
    const { id } = await t.api.createSession('reviewed', { keepWarmMs: 0 })
    const approvalId = await ask(id)
    const asked = await replyOfTurn(id, 1)
    for (let i = 0; i < 200 && (await t.api.call('GET', `/v1/sessions/${id}`)).body.warm; i++)
      await new Promise((resolve) => setTimeout(resolve, 50))
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.warm).toBe(false)
    expect((await answer(id, approvalId, { decision: 'approve', note: 'cold' })).status).toBe(200)
    const delivered = await replyOfTurn(id, 2)
    expect(delivered.response).toBe(`got ${approvalId} approve cold`)
    expect(delivered.sandboxId).not.toBe(asked.sandboxId)
  })

  it('expires a request left unanswered past approvalTimeoutMs, refuses its answer, and tells the agent with its next message', async () => {
    const { id } = await t.api.createSession('reviewed', { policy: { approvalTimeoutMs: 1000 } })
    const approvalId = await ask(id)
    const request = (await t.api.call('GET', `/v1/sessions/${id}/approvals/${approvalId}`)).body
    expect(Date.parse(request.expiresAt) - Date.parse(request.requestedAt)).toBe(1000)
    let status = request.status
    for (let i = 0; i < 100 && status === 'pending'; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50))
      status = (await t.api.call('GET', `/v1/sessions/${id}/approvals/${approvalId}`)).body.status
    }
    expect(status).toBe('expired')
    const late = await answer(id, approvalId, { decision: 'approve' })
    expect(late.status).toBe(409)
    expect(late.body.error.code).toBe('approval_expired')
    const next = await t.api.send(id, 'anything new?')
    expect(next.text).toBe(`got ${approvalId} expired None`)
    expect(
      (await t.api.call('GET', `/v1/sessions/${id}/approvals/${approvalId}`)).body.deliveredTurnId,
    ).toMatch(/^trn_/)
  })

  it('keeps a pending request across a restart of the server and delivers the answer given to the new one', async () => {
    const { id } = await t.api.createSession('reviewed-http')
    const approvalId = await ask(id)
    await t.close()
    await start()
    const got = await t.api.call('GET', `/v1/sessions/${id}/approvals/${approvalId}`)
    expect(got.body.status).toBe('pending')
    expect((await answer(id, approvalId, { decision: 'approve', note: 'after restart' })).status).toBe(200)
    expect((await replyOfTurn(id, 2)).response).toBe(`got ${approvalId} approve after restart`)
  })
})
