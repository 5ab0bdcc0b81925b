import { readdir, stat } from 'node:fs/promises'
import path from 'node:path'
import { Cairn } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { closeOwned } from '../helpers/pool-owners.js'
import { makeProject, SHELL_AGENT } from '../helpers/projects.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'

/**
 * Artifacts count in the tenant's one storage budget, with its pool trees (issue 28, item 3):
 * space is reserved before a copy starts, so concurrent saves cannot each pass the same check, and
 * deleting an artifact gives its bytes back. The file saved is sparse: it counts at its apparent
 * size, and the copy is written densely.
 */
const MiB = 1024 * 1024
const TENANT_MIB = 80
const FILE_MIB = 30

async function artifactFiles(dataDir: string): Promise<{ count: number; bytes: number }> {
  const root = path.join(dataDir, 'artifacts')
  let count = 0
  let bytes = 0
  for (const agent of await readdir(root).catch(() => [])) {
    for (const name of await readdir(path.join(root, agent))) {
      count++
      bytes += (await stat(path.join(root, agent, name))).size
    }
  }
  return { count, bytes }
}

describe('artifacts in the tenant storage budget', () => {
  let t: TestServer
  let tenant: Api
  let other: Api
  let session = ''

  beforeAll(async () => {
    t = await startTestServer({
      server: { workspaceQuotaMiB: 0, tenantQuotaMiB: TENANT_MIB, rateLimitPerSecond: 0 },
    })
    const project = await makeProject({
      'cairn.yaml': 'name: shell\ncommand: bash agent.sh\n',
      'agent.sh': SHELL_AGENT,
    })
    for (const tenantName of ['tenant-a', 'tenant-b']) {
      const key = await t.api.call('POST', '/v1/keys', { tenant: tenantName, role: 'admin' })
      expect(key.status).toBe(201)
      const api = new Api(t.url, key.body.key)
      expect((await api.deploy(project)).status).toBe(201)
      if (tenantName === 'tenant-a') tenant = api
      else other = api
    }
    session = (await tenant.createSession('shell')).id
    const made = await tenant.send(session, `truncate -s ${FILE_MIB}M sparse.bin && du -k sparse.bin`)
    expect(made.text).toMatch(/^0\tsparse\.bin\n\[exit 0\]\n$/)
  })

  afterAll(async () => {
    await closeOwned(t)
  })

  const save = (file: string) => tenant.call('POST', `/v1/sessions/${session}/artifacts`, { path: file })

  it('five concurrent saves over the quota: exactly what fits is accepted, the rest refused quota_exceeded', async () => {
    const answers = await Promise.all([1, 2, 3, 4, 5].map(() => save('sparse.bin')))
    const accepted = answers.filter((a) => a.status === 201)
    const refused = answers.filter((a) => a.status !== 201)
    // The pool holds well under one file's size for this tenant: two copies fit in 80 MiB, a third does not.
    expect(accepted).toHaveLength(2)
    expect(refused).toHaveLength(3)
    for (const answer of refused) {
      expect(answer.status).toBe(507)
      expect(answer.body.error.code).toBe('quota_exceeded')
      expect(answer.body.error.details).toMatchObject({
        quotaBytes: TENANT_MIB * MiB,
        askedBytes: FILE_MIB * MiB,
      })
    }
    for (const answer of accepted) expect(answer.body.sizeBytes).toBe(FILE_MIB * MiB)
    // Nothing over the quota on disk: the two copies (dense) and nothing of the refused ones.
    const files = await artifactFiles(t.dataDir)
    expect(files).toEqual({ count: 2, bytes: 2 * FILE_MIB * MiB })
    expect((await tenant.call('GET', '/v1/agents/shell/artifacts')).body.data).toHaveLength(2)
    // The tenant sees them in its usage; nothing is left reserved.
    const usage = await tenant.call('GET', '/v1/usage')
    expect(usage.body.artifacts).toEqual({ count: 2, bytes: 2 * FILE_MIB * MiB, reservedBytes: 0 })
  })

  it('counts with the pool: a file written into the workspace leaves no room for the next copy', async () => {
    const wrote = await tenant.send(session, 'head -c 15M /dev/urandom > dense.bin && sync && echo ok')
    expect(wrote.text).toContain('ok')
    await tenant.send(session, 'truncate -s 8M small.bin')
    // 60 MiB of artifacts and 15 MiB in the pool: 8 MiB more would pass 80 MiB.
    const refused = await save('small.bin')
    expect(refused.status).toBe(507)
    expect(refused.body.error.code).toBe('quota_exceeded')
    expect(refused.body.error.details.poolBytes).toBeGreaterThanOrEqual(15 * MiB)
  })

  it('deleting an artifact frees its bytes from the budget; another tenant cannot delete it', async () => {
    const [first] = (await tenant.call('GET', '/v1/agents/shell/artifacts')).body.data as { id: string }[]
    const id = first?.id ?? ''
    const foreign = await other.call('DELETE', `/v1/agents/shell/artifacts/${id}`)
    expect(foreign.status).toBe(404)
    const sdk = new Cairn({ baseUrl: t.url, apiKey: tenant.key })
    expect(await sdk.agents.deleteArtifact('shell', id)).toMatchObject({ id, sizeBytes: FILE_MIB * MiB })
    expect((await sdk.agents.artifacts('shell')).map((a) => a.id)).not.toContain(id)
    expect((await tenant.call('GET', `/v1/agents/shell/artifacts/${id}`)).status).toBe(404)
    expect((await tenant.call('DELETE', `/v1/agents/shell/artifacts/${id}`)).status).toBe(404)
    expect(await artifactFiles(t.dataDir)).toEqual({ count: 1, bytes: FILE_MIB * MiB })
    const fits = await save('small.bin')
    expect(fits.status, JSON.stringify(fits.body)).toBe(201)
  })

  it("counts a running command's output log at its bound: it leaves no room for a copy that fits without it", async () => {
    const cat = await tenant.call('POST', `/v1/sessions/${session}/commands`, {
      command: ['cat'],
      stdin: true,
    })
    expect(cat.status, JSON.stringify(cat.body)).toBe(201)
    const usage = (await tenant.call('GET', '/v1/usage')).body
    expect(usage.commandLogs).toEqual({ count: 1, bytes: 8 * MiB })
    // A file 4 MiB smaller than what is left without the command's log: it fits only without it.
    const held = usage.quota.usedBytes + usage.artifacts.bytes
    const size = TENANT_MIB * MiB - held - 4 * MiB
    expect((await tenant.send(session, `truncate -s ${size} edge.bin && echo ok`)).text).toContain('ok')
    const refused = await save('edge.bin')
    expect(refused.status).toBe(507)
    expect(refused.body.error.details).toMatchObject({ commandLogBytes: 8 * MiB, askedBytes: size })
    // Ended, the command keeps what it wrote (nothing): the same copy fits.
    const input = `/v1/sessions/${session}/commands/${cat.body.id}/stdin`
    expect((await tenant.call('POST', input, { close: true })).status).toBe(200)
    for (let i = 0; i < 100; i++) {
      const got = await tenant.call('GET', `/v1/sessions/${session}/commands/${cat.body.id}`)
      if (got.body.status === 'exited') break
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    expect((await tenant.call('GET', '/v1/usage')).body.commandLogs).toEqual({ count: 1, bytes: 0 })
    const fits = await save('edge.bin')
    expect(fits.status, JSON.stringify(fits.body)).toBe(201)
  })
})
