import { readFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
const VALUE = 'sk-test-7f3a9c1e5b2d4680'

beforeAll(async () => {
  t = await startTestServer()
  const project = await makeProject({
    'cairn.yaml': 'name: keyed\ncommand: bash agent.sh\nsecrets: [API_TOKEN]\n',
    'agent.sh':
      'while IFS= read -r line; do\n  if [ "$line" = leak ]; then echo "token=$API_TOKEN"; else echo "len=${#API_TOKEN}"; fi\ndone\n',
  })
  expect((await t.api.deploy(project)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

describe('secrets', () => {
  it('refuses a session while a required secret is missing, naming it', async () => {
    const res = await t.api.call('POST', '/v1/sessions', { agent: 'keyed' })
    expect(res.status).toBe(409)
    expect(res.body.error.code).toBe('secrets_missing')
    expect(res.body.error.details.missing).toEqual(['API_TOKEN'])
    expect(res.body.error.message).toContain('API_TOKEN')
    const listed = await t.api.call('GET', '/v1/agents/keyed/secrets')
    expect(listed.body.missing).toEqual(['API_TOKEN'])
  })

  it('stores values encrypted, never returns them, gives them to the agent and redacts them', async () => {
    const set = await t.api.call('PUT', '/v1/agents/keyed/secrets', { secrets: { API_TOKEN: VALUE } })
    expect(set.status).toBe(200)
    expect(JSON.stringify(set.body)).not.toContain(VALUE)
    expect(set.body.data.map((s: { name: string }) => s.name)).toEqual(['API_TOKEN'])
    expect(set.body.missing).toEqual([])

    const session = await t.api.createSession('keyed')
    expect((await t.api.send(session.id, 'length')).text).toBe(`len=${VALUE.length}\n`)
    const leak = await t.api.send(session.id, 'leak')
    expect(leak.text).toBe('token=[redacted:API_TOKEN]\n')
    const transcript = await t.api.call('GET', `/v1/sessions/${session.id}/messages`)
    expect(JSON.stringify(transcript.body)).not.toContain(VALUE)

    const db = readFileSync(path.join(t.dataDir, 'cairn.db'))
    const wal = readFileSync(path.join(t.dataDir, 'cairn.db-wal'))
    expect(db.includes(VALUE)).toBe(false)
    expect(wal.includes(VALUE)).toBe(false)

    const bad = await t.api.call('PUT', '/v1/agents/keyed/secrets', { secrets: { 'bad name': 'x' } })
    expect(bad.status).toBe(400)
    expect((await t.api.call('DELETE', '/v1/agents/keyed/secrets/API_TOKEN')).body).toEqual({ ok: true })
    expect((await t.api.call('POST', '/v1/sessions', { agent: 'keyed' })).status).toBe(409)
  })
})
