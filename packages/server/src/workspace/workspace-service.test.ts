import { readdirSync } from 'node:fs'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from '../../../../test/helpers/projects.js'
import { startTestServer, type TestServer } from '../../../../test/helpers/server.js'

/**
 * The parts of the workspace service (files, history, archive, manifest) through the API of a
 * real server, whose runtime they reach only through its port.
 */
let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  expect((await t.api.deploy(await makeProject({ ...SHELL_PROJECT, 'README.md': 'seed\n' }))).status).toBe(
    201,
  )
})

afterAll(async () => {
  await t?.close()
})

const run = async (id: string, command: string) => {
  const result = await t.api.send(id, command)
  expect(result.terminal?.type, JSON.stringify(result.events)).toBe('run.completed')
  return result.text
}
const names = async (id: string, query = '') =>
  ((await t.api.call('GET', `/v1/sessions/${id}/files${query}`)).body.data as { name: string }[])
    .map((e) => e.name)
    .sort()
const poolSnapshots = () => readdirSync(`${t.server.runtime.pool.root}/snapshots`).length

describe('WorkspaceFiles', () => {
  it('writes, lists, reads, diffs and deletes files of the live workspace', async () => {
    const { id } = await t.api.createSession('shell')
    const put = await t.api.call(
      'PUT',
      `/v1/sessions/${id}/files/content?path=docs/a.txt`,
      Buffer.from('alpha'),
    )
    expect(put.status).toBe(200)
    expect(await names(id)).toEqual(['README.md', 'agent.sh', 'cairn.yaml', 'docs'])
    expect(await names(id, '?path=docs')).toEqual(['a.txt'])
    const content = await fetch(`${t.url}/v1/sessions/${id}/files/content?path=docs/a.txt`, {
      headers: { authorization: `Bearer ${t.key}` },
    })
    expect(await content.text()).toBe('alpha')
    const diff = await t.api.call('GET', `/v1/sessions/${id}/diff`)
    expect(diff.body).toMatchObject({ added: ['docs', 'docs/a.txt'], changed: [], deleted: [] })
    // The agent sees what the API wrote.
    expect(await run(id, 'cat docs/a.txt')).toBe('alpha[exit 0]\n')
    expect((await t.api.call('DELETE', `/v1/sessions/${id}/files?path=docs`)).status).toBe(200)
    expect((await t.api.call('GET', `/v1/sessions/${id}/diff`)).body).toMatchObject({
      added: [],
      deleted: [],
    })
  })
})

describe('WorkspaceHistory', () => {
  it('restores a snapshot exactly and records it; a fork is a session row the session service wrote', async () => {
    const { id } = await t.api.createSession('shell')
    await run(id, 'echo v1 > state.txt')
    const snap = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, { label: 'v1' })
    expect(snap.status).toBe(201)
    await run(id, 'echo v2 > state.txt && touch extra')
    const restored = await t.api.call('POST', `/v1/sessions/${id}/restore`, { snapshotId: snap.body.id })
    expect(restored.status).toBe(200)
    expect(await run(id, 'cat state.txt; ls extra')).toContain('v1\n')
    const events = (await t.api.call('GET', `/v1/sessions/${id}/events`)).body.data as { cause: string }[]
    expect(events.map((e) => e.cause)).toContain('workspace_restored')

    const fork = await t.api.call('POST', `/v1/sessions/${id}/fork`, { snapshotId: snap.body.id })
    expect(fork.status).toBe(201)
    expect(fork.body).toMatchObject({ status: 'idle', statusCause: 'forked' })
    const childManifest = await t.api.call('GET', `/v1/sessions/${fork.body.id}/manifest`)
    expect(childManifest.body).toMatchObject({ parentSessionId: id, forkedFromSnapshotId: snap.body.id })
    expect(await run(fork.body.id, 'cat state.txt')).toBe('v1\n[exit 0]\n')
  })
})

describe('WorkspaceArchive', () => {
  it('exports the live workspace without leaving its temporary snapshot, and merges it into another', async () => {
    const { id: source } = await t.api.createSession('shell')
    await run(source, 'mkdir -p out && echo carried > out/c.txt')
    await t.api.snapshotAfter(source, 1)
    const before = poolSnapshots()
    const exported = await fetch(`${t.url}/v1/sessions/${source}/export`, {
      headers: { authorization: `Bearer ${t.key}` },
    })
    expect(exported.status).toBe(200)
    const archive = Buffer.from(await exported.arrayBuffer())
    expect(archive.subarray(0, 2)).toEqual(Buffer.from([0x1f, 0x8b]))
    // The temporary snapshot goes once the stream is sent.
    for (let i = 0; i < 100 && poolSnapshots() !== before; i++) await new Promise((r) => setTimeout(r, 50))
    expect(poolSnapshots()).toBe(before)

    const { id: target } = await t.api.createSession('shell')
    await run(target, 'echo mine > own.txt')
    const merged = await t.api.call('PUT', `/v1/sessions/${target}/workspace?mode=merge`, archive)
    expect(merged.status, JSON.stringify(merged.body)).toBe(200)
    expect(await run(target, 'cat out/c.txt own.txt')).toBe('carried\nmine\n[exit 0]\n')
  })
})

describe('WorkspaceManifest', () => {
  it("names the runtime's drivers and the open ports, read through the port", async () => {
    const { id } = await t.api.createSession('shell')
    const manifest = await t.api.call('GET', `/v1/sessions/${id}/manifest`)
    expect(manifest.status).toBe(200)
    expect(manifest.body).toMatchObject({
      driver: 'bwrap',
      storage: 'btrfs',
      openPorts: [],
      dirtyFiles: { added: [] },
    })
  })
})
