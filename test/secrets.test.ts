import { readFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { openDatabase } from '../packages/server/src/db/database.js'
import { testDatabaseFor } from './fixtures/test-database.mjs'
import { makeProject } from './helpers/projects.js'
import { packDir, startTestServer, type TestServer } from './helpers/server.js'

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

    const database = await testDatabaseFor(t.dataDir)
    if (database) {
      // PostgreSQL: what its tables hold, byte for byte (secrets sealed; turns and events redacted).
      const db = await openDatabase(database)
      try {
        for (const table of ['secrets', 'turns', 'session_events', 'sessions'] as const) {
          const rows = await db.kysely.selectFrom(table).selectAll().execute()
          expect(rows.length).toBeGreaterThan(0)
          for (const row of rows)
            for (const value of Object.values(row))
              expect(Buffer.from(Buffer.isBuffer(value) ? value : String(value)).includes(VALUE)).toBe(false)
        }
      } finally {
        await db.close()
      }
    } else {
      const db = readFileSync(path.join(t.dataDir, 'cairn.db'))
      const wal = readFileSync(path.join(t.dataDir, 'cairn.db-wal'))
      expect(db.includes(VALUE)).toBe(false)
      expect(wal.includes(VALUE)).toBe(false)
    }

    const bad = await t.api.call('PUT', '/v1/agents/keyed/secrets', { secrets: { 'bad name': 'x' } })
    expect(bad.status).toBe(400)
    expect((await t.api.call('DELETE', '/v1/agents/keyed/secrets/API_TOKEN')).body).toEqual({ ok: true })
    expect((await t.api.call('POST', '/v1/sessions', { agent: 'keyed' })).status).toBe(409)
  })

  it('gives setup secrets to the build only and runtime secrets to the agent only', async () => {
    const SETUP_VALUE = 'setup-only-4be1d07c93'
    const RUNTIME_VALUE = 'runtime-only-8e2f51a6b7'
    const files = {
      'cairn.yaml': 'name: scoped\ncommand: bash agent.sh\nsetup: bash setup.sh\n',
      // The build records which variables it saw (lengths, not values) and prints one value outright.
      'setup.sh':
        'echo "setup=${#SETUP_TOKEN} runtime=${#RUN_TOKEN}" > seen-at-build.txt\necho "printing $SETUP_TOKEN"\n',
      'agent.sh':
        'while IFS= read -r l; do echo "build saw: $(cat seen-at-build.txt); agent sees setup=${#SETUP_TOKEN} runtime=${#RUN_TOKEN}"; done\n',
    }
    const first = await t.api.call('POST', '/v1/agents?wait=true', await packDir(await makeProject(files)))
    expect(first.body.revision.status).toBe('READY')

    const setup = await t.api.call('PUT', '/v1/agents/scoped/secrets', {
      secrets: { SETUP_TOKEN: SETUP_VALUE },
      scope: 'setup',
    })
    expect(setup.status).toBe(200)
    await t.api.call('PUT', '/v1/agents/scoped/secrets', { secrets: { RUN_TOKEN: RUNTIME_VALUE } })
    const listed = await t.api.call('GET', '/v1/agents/scoped/secrets')
    expect(listed.body.data.map((s: { name: string; scope: string }) => [s.name, s.scope])).toEqual([
      ['RUN_TOKEN', 'runtime'],
      ['SETUP_TOKEN', 'setup'],
    ])
    const badScope = await t.api.call('PUT', '/v1/agents/scoped/secrets', {
      secrets: { X: 'y' },
      scope: 'everywhere',
    })
    expect(badScope.status).toBe(400)

    // A new revision is built with the setup secret present.
    const second = await t.api.call('POST', '/v1/agents?wait=true', await packDir(await makeProject(files)))
    expect(second.body.revision.status).toBe('READY')
    const log = await t.api.call('GET', `/v1/agents/scoped/revisions/${second.body.revision.id}/logs`)
    expect(log.body.lines).toContain('printing [redacted:SETUP_TOKEN]')
    expect(JSON.stringify(log.body)).not.toContain(SETUP_VALUE)

    const session = await t.api.createSession('scoped')
    expect((await t.api.send(session.id, 'go')).text).toBe(
      `build saw: setup=${SETUP_VALUE.length} runtime=0; agent sees setup=0 runtime=${RUNTIME_VALUE.length}\n`,
    )
  })
})

describe('proxy secrets and the allowlist', () => {
  const project = (allow: string[]) =>
    makeProject({
      'cairn.yaml': `name: bound\ncommand: bash agent.sh\n${allow.length > 0 ? `network:\n  allow: [${allow.map((h) => `"${h}"`).join(', ')}]\n` : ''}`,
      'agent.sh': 'while IFS= read -r line; do echo "$line"; done\n',
    })
  const bind = (hosts: string[]) =>
    t.api.call('PUT', '/v1/agents/bound/secrets', { secrets: { API_TOKEN: VALUE }, scope: 'proxy', hosts })

  it('refuses binding a proxy secret to a host the current revision does not allow, naming both', async () => {
    expect((await t.api.deploy(await project(['api.example.com', '*.example.org:8443']))).status).toBe(201)
    const outside = await bind(['api.example.com', 'other.example.com'])
    expect(outside.status).toBe(400)
    expect(outside.body.error).toMatchObject({
      code: 'validation_failed',
      details: { secret: 'API_TOKEN', host: 'other.example.com' },
    })
    expect(outside.body.error.message).toContain('API_TOKEN')
    expect(outside.body.error.message).toContain('other.example.com')
    // The port counts as it does for the proxy; nothing was stored.
    expect((await bind(['api.example.com:8443'])).status).toBe(400)
    expect((await bind(['x.example.org'])).status).toBe(400)
    expect((await t.api.call('GET', '/v1/agents/bound/secrets')).body.data).toEqual([])
    // Allowed hosts, and a wildcard binding the allowlist names a host under.
    expect((await bind(['api.example.com', 'x.example.org:8443'])).status).toBe(200)
    expect((await bind(['*.example.com'])).status).toBe(200)
    expect((await bind(['api.example.com'])).status).toBe(200)
  })

  it('names extra headers a proxy secret is swapped into, for the proxy scope only, never framing ones', async () => {
    const put = (body: Record<string, unknown>) =>
      t.api.call('PUT', '/v1/agents/bound/secrets', { secrets: { API_TOKEN: VALUE }, ...body })
    const declared = await put({
      scope: 'proxy',
      hosts: ['api.example.com'],
      headers: ['X-Token', 'x-token'],
    })
    expect(declared.status, JSON.stringify(declared.body)).toBe(200)
    expect(declared.body.data).toEqual([
      expect.objectContaining({ name: 'API_TOKEN', hosts: ['api.example.com'], headers: ['x-token'] }),
    ])
    for (const body of [
      { headers: ['x-token'] },
      { scope: 'proxy', hosts: ['api.example.com'], headers: ['host'] },
      { scope: 'proxy', hosts: ['api.example.com'], headers: ['content-length'] },
      { scope: 'proxy', hosts: ['api.example.com'], headers: ['x token'] },
    ]) {
      const refused = await put(body)
      expect(refused.status, JSON.stringify(body)).toBe(400)
      expect(refused.body.error.code).toBe('validation_failed')
    }
    // Set again without headers: the declaration goes with it.
    const plain = await put({ scope: 'proxy', hosts: ['api.example.com'] })
    expect(plain.body.data).toEqual([expect.not.objectContaining({ headers: expect.anything() })])
  })

  it('refuses a deploy whose allowlist drops a host a proxy secret is bound to; no revision is made', async () => {
    const before = (await t.api.call('GET', '/v1/agents/bound')).body.revisions.length
    const narrowed = await t.api.deploy(await project(['*.example.org:8443']))
    expect(narrowed.status).toBe(400)
    expect(narrowed.body.error).toMatchObject({
      code: 'invalid_manifest',
      details: { secret: 'API_TOKEN', host: 'api.example.com' },
    })
    expect(narrowed.body.error.message).toContain("cairn.yaml's network.allow")
    const none = await t.api.deploy(await project([]))
    expect(none.status).toBe(400)
    expect(none.body.error.code).toBe('invalid_manifest')
    expect((await t.api.call('GET', '/v1/agents/bound')).body.revisions.length).toBe(before)
    // A wildcard covering the bound host is enough.
    expect((await t.api.deploy(await project(['*.example.com']))).status).toBe(201)
    // Without the proxy secret, any allowlist deploys.
    expect((await t.api.call('DELETE', '/v1/agents/bound/secrets/API_TOKEN')).status).toBe(200)
    expect((await t.api.deploy(await project([]))).status).toBe(201)
  })
})
