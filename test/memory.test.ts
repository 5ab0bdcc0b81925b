import { existsSync } from 'node:fs'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  const shell = await makeProject(SHELL_PROJECT)
  expect((await t.api.deploy(shell)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

const run = async (id: string, command: string) => (await t.api.send(id, command)).text

describe('agent memory, artifacts and ephemeral sessions', () => {
  it('mounts the memory read-only, and a second session reads what the first one promoted', async () => {
    const put = await t.api.call('PUT', '/v1/agents/shell/memory', { content: 'The user prefers tabs.\n' })
    expect(put.body).toMatchObject({ version: 1, source: 'api' })
    const first = await t.api.createSession('shell')
    expect(await run(first.id, 'cat /memory/MEMORY.md')).toBe('The user prefers tabs.\n[exit 0]\n')
    expect(await run(first.id, 'echo x > /memory/MEMORY.md')).toContain('Read-only file system')
    await run(
      first.id,
      'mkdir -p .cairn && printf "The user prefers tabs.\\nThe project is called Cairn.\\n" > .cairn/memory.proposed.md',
    )
    // Promoted after the turn ends, in the background: the new version shows within a few seconds.
    let memory = await t.api.call('GET', '/v1/agents/shell/memory')
    for (let i = 0; i < 50 && memory.body.version < 2; i++) {
      await new Promise((r) => setTimeout(r, 100))
      memory = await t.api.call('GET', '/v1/agents/shell/memory')
    }
    expect(memory.body).toMatchObject({
      version: 2,
      content: 'The user prefers tabs.\nThe project is called Cairn.\n',
    })
    expect(memory.body.source).toContain(first.id)
    const second = await t.api.createSession('shell')
    expect(await run(second.id, 'cat /memory/MEMORY.md')).toContain('The project is called Cairn.')
    const stale = await t.api.call('PUT', '/v1/agents/shell/memory', { content: 'x', baseVersion: 1 })
    expect(stale.status).toBe(409)
  })

  it('keeps a promoted artifact after its session is deleted', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo "final report" > report.txt && ln -s /etc/hostname sneaky')
    const saved = await t.api.call('POST', `/v1/sessions/${id}/artifacts`, { path: 'report.txt' })
    expect(saved.status).toBe(201)
    expect(saved.body).toMatchObject({ path: '/workspace/report.txt', sizeBytes: 13 })
    expect((await t.api.call('POST', `/v1/sessions/${id}/artifacts`, { path: 'sneaky' })).status).toBe(403)
    await t.api.call('DELETE', `/v1/sessions/${id}`)
    const list = await t.api.call('GET', '/v1/agents/shell/artifacts')
    expect(list.body.data.map((a: { id: string }) => a.id)).toContain(saved.body.id)
    const body = await t.api.call('GET', `/v1/agents/shell/artifacts/${saved.body.id}`)
    expect(body.body).toBe('final report\n')
  })

  it('leaves nothing of an ephemeral session on disk after it ends', async () => {
    const session = await t.api.call('POST', '/v1/sessions', { agent: 'shell', ephemeral: true })
    expect(session.body.ephemeral).toBe(true)
    const id = session.body.id as string
    await run(id, 'echo scratch > scratch.txt')
    const snaps = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data as { id: string }[]
    expect(snaps.length).toBeGreaterThan(0)
    const ended = await t.api.call('POST', `/v1/sessions/${id}/end`)
    expect(ended.body).toMatchObject({ status: 'deleted', statusCause: 'ephemeral_end' })
    expect(existsSync(t.server.runtime.pool.workspacePath(id))).toBe(false)
    for (const s of snaps) expect(existsSync(t.server.runtime.pool.snapshotPath(s.id))).toBe(false)
    expect((await t.api.call('GET', `/v1/sessions/${id}/messages`)).body.data).toEqual([])

    const kept = await t.api.call('POST', '/v1/sessions', {
      agent: 'shell',
      ephemeral: true,
      keepTranscript: true,
    })
    await run(kept.body.id, 'echo hi')
    await t.api.call('POST', `/v1/sessions/${kept.body.id}/end`)
    expect((await t.api.call('GET', `/v1/sessions/${kept.body.id}/messages`)).body.data).toHaveLength(2)
    expect(existsSync(t.server.runtime.pool.workspacePath(kept.body.id))).toBe(false)
  })
})
