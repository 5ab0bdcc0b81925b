import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, spawnCli } from './helpers/cli.js'
import { TestPostgres } from './helpers/postgres.js'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { Api, startTestServer, type TestServer } from './helpers/server.js'

// `cairn migrate`: a SQLite install moved into PostgreSQL loses no row, and a server started on
// the same data dir with --database serves it all and carries on.
const TOKEN = 'migrated-secret-5d1e9a'
let postgres: TestPostgres
let dataDir = ''
const servers: TestServer[] = []

beforeAll(async () => {
  assertBuilt()
  postgres = await TestPostgres.start()
  dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-migrate-'))
}, 120_000)

afterAll(async () => {
  for (const s of servers) await s.close().catch(() => undefined)
  await postgres?.stop()
  if (dataDir) await rm(dataDir, { recursive: true, force: true })
})

/** Everything the API shows of the install: what must be the same after the move. */
async function everything(api: Api, sessionIds: string[]) {
  const out: Record<string, unknown> = {
    sessions: (await api.call('GET', '/v1/sessions?limit=200')).body,
    agents: (await api.call('GET', '/v1/agents/shell')).body,
    secrets: (await api.call('GET', '/v1/agents/shell/secrets')).body,
    artifacts: (await api.call('GET', '/v1/agents/shell/artifacts')).body,
    keys: (await api.call('GET', '/v1/keys')).body,
  }
  for (const id of sessionIds) {
    for (const what of ['messages', 'events', 'turns', 'snapshots', 'network', 'commands'])
      out[`${id}/${what}`] = (await api.call('GET', `/v1/sessions/${id}/${what}`)).body
  }
  // A new process: no sandbox is warm yet, and the key's last use is now.
  return JSON.parse(JSON.stringify(out), (key, value) =>
    key === 'warm' || key === 'lastUsedAt' ? undefined : value,
  ) as Record<string, unknown>
}

describe('cairn migrate', () => {
  it('moves a SQLite install to PostgreSQL without losing a row; the server goes on there', async () => {
    // On SQLite, whatever database the suite runs on.
    const before = await startTestServer({ dataDir, server: { database: undefined } })
    servers.push(before)
    const { api } = before
    expect((await api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
    expect((await api.call('PUT', '/v1/agents/shell/secrets', { secrets: { TOKEN } })).status).toBe(200)
    const ids: string[] = []
    for (let i = 0; i < 3; i++) {
      const session = await api.createSession('shell', { title: `session ${i}` })
      ids.push(session.id)
      expect((await api.send(session.id, `echo ${i} > n.txt && cat n.txt`)).text).toContain(`${i}`)
      expect((await api.send(session.id, 'echo second turn')).text).toContain('second turn')
      await api.snapshotAfter(session.id, 1)
    }
    expect((await api.call('POST', `/v1/sessions/${ids[0]}/snapshots`, { label: 'kept' })).status).toBe(201)
    // A command's record moves too (it was left behind: the table was missing from the copy).
    const command = await api.call('POST', `/v1/sessions/${ids[0]}/commands`, { command: ['true'] })
    expect(command.status).toBe(201)
    for (let i = 0; i < 100; i++) {
      const row = await api.call('GET', `/v1/sessions/${ids[0]}/commands/${command.body.id}`)
      if (row.body.status === 'exited') break
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    expect((await api.call('POST', `/v1/sessions/${ids[1]}/end`)).status).toBe(200)
    const artifact = await api.call('POST', `/v1/sessions/${ids[2]}/artifacts`, { path: 'n.txt' })
    expect(artifact.status).toBe(201)
    const seen = await everything(api, ids)
    await before.close()
    servers.splice(servers.indexOf(before), 1)

    const url = await postgres.createDatabase()
    const migrated = await spawnCli(['migrate', '--from', dataDir, '--to', url, '--json'], {}).done
    expect(migrated.stderr).toBe('')
    expect(migrated.code).toBe(0)
    const report = JSON.parse(migrated.stdout) as { rows: Record<string, number> }
    expect(report.rows).toMatchObject({
      sessions: 3,
      commands: 1,
      turns: 6,
      secrets: 1,
      artifacts: 1,
      artifact_blobs: 1,
    })
    expect(report.rows.shared_files).toBeGreaterThanOrEqual(1)

    // Into a database that holds an install already: refused, nothing copied twice.
    const again = await spawnCli(['migrate', '--from', dataDir, '--to', url], {}).done
    expect(again.code).not.toBe(0)
    expect(again.stderr).toContain('already holds a Cairn install')

    const after = await startTestServer({ dataDir, server: { database: url } })
    servers.push(after)
    const moved = new Api(after.url, before.key)
    expect(await everything(moved, ids)).toEqual(seen)
    // The session goes on: its workspace, its transcript and its secret (sealed with the old key).
    const next = await moved.send(ids[0] as string, 'cat n.txt && echo ${#TOKEN}')
    expect(next.text).toBe(`0\n${TOKEN.length}\n[exit 0]\n`)
    expect((await moved.call('GET', `/v1/sessions/${ids[0]}/turns`)).body.data).toHaveLength(3)
    const bytes = await fetch(`${after.url}/v1/agents/shell/artifacts/${artifact.body.id}`, {
      headers: { authorization: `Bearer ${before.key}` },
    })
    expect(await bytes.text()).toBe('2\n')
  })
})
