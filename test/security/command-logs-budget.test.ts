import { execFileSync } from 'node:child_process'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// Command output logs (docs/commands.md: 8 MiB per command, a session's last 16 ended commands
// kept) are written under the node's data dir, beside the database: bytes a tenant makes the
// server keep, so they count in its storage budget. Before 57b9ed6 they did not: 16 commands of
// one session kept 134,291,456 bytes of logs under a 40 MiB tenant quota (sessions have no cap,
// so a tenant filled the data disk at 128 MiB per session). Now the fifth command is refused.
const TENANT_MIB = 40
const MiB = 1024 * 1024
let t: TestServer

beforeAll(async () => {
  t = await startTestServer({
    server: { workspaceQuotaMiB: 0, tenantQuotaMiB: TENANT_MIB, rateLimitPerSecond: 0 },
  })
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

const logBytes = () =>
  Number(
    execFileSync('du', ['-sb', path.join(t.dataDir, 'command-logs')], { encoding: 'utf8' }).split('\t')[0],
  )

describe('command output logs in the tenant storage budget', () => {
  it('keep no more than the tenant quota for a tenant', async () => {
    const session = (await t.api.createSession('shell')).id
    for (let i = 0; i < 16; i++) {
      const started = await t.api.call('POST', `/v1/sessions/${session}/commands`, {
        command: ['head', '-c', String(8 * MiB), '/dev/zero'],
      })
      if (started.status !== 201) break
      for (let n = 0; n < 200; n++) {
        const got = await t.api.call('GET', `/v1/sessions/${session}/commands/${started.body.id}`)
        if (got.body.status !== 'running') break
        await new Promise((r) => setTimeout(r, 50))
      }
    }
    expect(await logBytes()).toBeLessThanOrEqual(TENANT_MIB * MiB)
  })
})
