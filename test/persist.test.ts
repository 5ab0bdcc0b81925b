import { gunzipSync } from 'node:zlib'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { closeOwned } from './helpers/pool-owners.js'
import { makeProject, SHELL_AGENT } from './helpers/projects.js'
import { rawTarGz } from './helpers/raw-tar.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// Persisted paths (cairn.yaml `persist:`, docs/persist.md): directories outside /workspace kept in
// the workspace's subvolume at .cairn-persist/<path>. One server; a tenant quota small enough that
// a write into a persisted path meets it like a write into /workspace.
const TENANT_MIB = 96
const STATE = '.cairn-persist/home/agent/.state'

let t: TestServer
let id: string

const run = async (session: string, line: string) => {
  const reply = await t.api.send(session, line)
  expect(reply.terminal?.type, JSON.stringify(reply.events)).toBe('run.completed')
  return reply.text
}

const manifest = (persist: string) => `name: stateful\ncommand: bash agent.sh\npersist: ${persist}\n`

beforeAll(async () => {
  t = await startTestServer({ server: { tenantQuotaMiB: TENANT_MIB, workspaceQuotaMiB: 0 } })
  const project = await makeProject({
    // The setup phase sees the persisted paths as the agent will.
    'cairn.yaml': `${manifest('["~/.state", /var/cache/app]')}session:\n  setup: echo from-setup > ~/.state/setup\n`,
    'agent.sh': SHELL_AGENT,
  })
  const deployed = await t.api.deploy(project)
  expect(deployed.status, JSON.stringify(deployed.body)).toBe(201)
  id = (await t.api.createSession('stateful')).id
})

afterAll(async () => {
  await closeOwned(t)
})

describe('persisted paths', () => {
  it('keeps ~ and the declared directories across a cold start, out of /workspace', async () => {
    const first = await run(
      id,
      'echo "$HOME"; cat ~/.state/setup; echo one > ~/.state/note; echo cached > /var/cache/app/c; ls -A /workspace/.cairn-persist | wc -l',
    )
    // HOME moved out of /workspace; the store under /workspace is masked (an empty read-only directory).
    expect(first).toBe('/home/agent\nfrom-setup\n0\n[exit 0]\n')
    expect(await run(id, 'echo x > ~/scratch; echo x > /workspace/.cairn-persist/y')).toContain(
      'Read-only file system',
    )
    await t.server.sessions.stopSandbox(id)
    const cold = await t.api.send(id, 'cat ~/.state/note /var/cache/app/c; ls ~')
    expect(cold.events.find((e) => e.type === 'run.started')).toMatchObject({ coldStart: true })
    // The declared directories came back; the rest of the home was the sandbox's own.
    expect(cold.text).toBe('one\ncached\n[exit 0]\n')
  })

  it('restores an older snapshot of a persisted path, and a fork carries it independently', async () => {
    const older = (await t.api.call('POST', `/v1/sessions/${id}/snapshots`, { label: 'one' })).body
      .id as string
    await run(id, 'echo two > ~/.state/note')
    const restored = await t.api.call('POST', `/v1/sessions/${id}/restore`, { snapshotId: older })
    expect(restored.status, JSON.stringify(restored.body)).toBe(200)
    expect(await run(id, 'cat ~/.state/note')).toBe('one\n[exit 0]\n')

    const forked = await t.api.call('POST', `/v1/sessions/${id}/fork`, { snapshotId: older })
    expect(forked.status, JSON.stringify(forked.body)).toBe(201)
    const fork = forked.body.id as string
    expect(await run(fork, 'cat ~/.state/note; echo fork > ~/.state/note')).toBe('one\n[exit 0]\n')
    expect(await run(id, 'cat ~/.state/note')).toBe('one\n[exit 0]\n')
    expect(await run(fork, 'cat ~/.state/note')).toBe('fork\n[exit 0]\n')
  })

  it('names persisted paths in the manifest, the diff and the export; the files API reads but never writes them', async () => {
    const manifestRes = await t.api.call('GET', `/v1/sessions/${id}/manifest`)
    expect(manifestRes.status).toBe(200)
    expect(manifestRes.body.persist).toEqual([
      { path: '~/.state', sandboxPath: '/home/agent/.state', workspacePath: STATE },
      {
        path: '/var/cache/app',
        sandboxPath: '/var/cache/app',
        workspacePath: '.cairn-persist/var/cache/app',
      },
    ])
    expect(manifestRes.body.dirtyFiles.added).toContain(`${STATE}/note`)
    const diff = await t.api.call('GET', `/v1/sessions/${id}/diff`)
    expect(diff.body.added).toContain(`${STATE}/note`)
    expect(diff.body.added).toContain('.cairn-persist/var/cache/app/c')
    expect(diff.body.added).not.toContain('note')

    const res = await fetch(`${t.url}/v1/sessions/${id}/export`, {
      headers: { authorization: `Bearer ${t.key}` },
    })
    expect(res.status).toBe(200)
    const exported = Buffer.from(await res.arrayBuffer())
    expect(gunzipSync(exported).toString('latin1')).toContain(`${STATE}/note`)
    // The archive imported into another session brings the state with it.
    const { id: copy } = await t.api.createSession('stateful')
    expect((await t.api.call('PUT', `/v1/sessions/${copy}/workspace`, exported)).status).toBe(200)
    expect(await run(copy, 'cat ~/.state/note')).toBe('one\n[exit 0]\n')

    const read = await t.api.call('GET', `/v1/sessions/${id}/files/content?path=${STATE}/note`)
    expect(read.status).toBe(200)
    expect(read.body).toBe('one\n')
    for (const path of [`${STATE}/note`, '.cairn-persist', '/workspace/.cairn-persist/home']) {
      const put = await t.api.call('PUT', `/v1/sessions/${id}/files/content?path=${path}`, 'forged\n', {
        'content-type': 'application/octet-stream',
      })
      expect(put.status, path).toBe(400)
      expect(put.body.error.code).toBe('validation_failed')
      const del = await t.api.call('DELETE', `/v1/sessions/${id}/files?path=${path}`)
      expect(del.status, path).toBe(400)
    }
    expect(await run(id, 'cat ~/.state/note')).toBe('one\n[exit 0]\n')
  })

  it('refuses to start on a store whose path is a link (an imported tree), following nothing', async () => {
    const { id: other } = await t.api.createSession('stateful')
    await run(other, 'true') // the setup phase ran: the next turn only starts the sandbox
    const archive = rawTarGz([
      { name: 'agent.sh', body: SHELL_AGENT },
      { name: 'src/', type: '5', mode: 0o755 },
      { name: 'src/elsewhere', body: 'not the state\n' },
      { name: '.cairn-persist/', type: '5', mode: 0o755 },
      { name: '.cairn-persist/home/', type: '5', mode: 0o755 },
      { name: '.cairn-persist/home/agent/', type: '5', mode: 0o755 },
      { name: '.cairn-persist/home/agent/.state', type: '2', linkname: '../../../src' },
    ])
    const imported = await t.api.call('PUT', `/v1/sessions/${other}/workspace`, archive)
    expect(imported.status, JSON.stringify(imported.body)).toBe(200)
    const reply = await t.api.send(other, 'ls ~/.state')
    expect(reply.text).not.toContain('elsewhere')
    expect(reply.terminal).toMatchObject({ type: 'run.failed', error: { code: 'sandbox_failed' } })
    expect(JSON.stringify(reply.terminal)).toContain('holds a link at .state')
  })

  it('refuses bad persist: values at deploy with invalid_manifest, naming the entry', async () => {
    const segment = fc.stringMatching(/^[a-z0-9._-]{1,8}$/).filter((s) => s !== '.' && s !== '..')
    const reserved = fc.constantFrom(
      '/workspace',
      '/proc',
      '/sys',
      '/dev',
      '/tmp',
      '/run',
      '/opt/cairn',
      '/etc',
      '/usr',
      '/memory',
      '/env',
    )
    const bad = fc.oneof(
      segment.map((s) => `${s}/x`), // relative
      fc.tuple(segment, fc.constantFrom('..', '.')).map(([s, dot]) => `~/${s}/${dot}/x`),
      segment.map((s) => `/var//${s}`),
      fc.tuple(reserved, fc.option(segment)).map(([r, s]) => (s ? `${r}/${s}` : r)),
      fc.constantFrom('/', '/opt', '/home', '~other/x', `~/${'n'.repeat(300)}`, '~/a\u0001b'),
    )
    await fc.assert(
      fc.asyncProperty(bad, async (value) => {
        const res = await t.api.deploy(
          await makeProject({ 'cairn.yaml': manifest(JSON.stringify([value])), 'agent.sh': SHELL_AGENT }),
        )
        expect(res.status, value).toBe(400)
        expect(res.body.error.code, value).toBe('invalid_manifest')
      }),
      { numRuns: 20 },
    )
    const refused = async (persist: string) => {
      const res = await t.api.deploy(
        await makeProject({ 'cairn.yaml': manifest(persist), 'agent.sh': SHELL_AGENT }),
      )
      expect(res.status, persist).toBe(400)
      return res.body.error
    }
    expect(await refused('["~/.a", "/home/agent/.a/b"]')).toMatchObject({
      code: 'invalid_manifest',
      details: { key: 'persist', index: 1 },
    })
    expect((await refused(JSON.stringify(Array.from({ length: 17 }, (_, i) => `~/d${i}`)))).code).toBe(
      'invalid_manifest',
    )
    // A project may not bring the store's name.
    const own = await t.api.deploy(
      await makeProject({ 'cairn.yaml': manifest('[~/.a]'), 'agent.sh': SHELL_AGENT, '.cairn-persist': 'x' }),
    )
    expect(own.status).toBe(400)
    expect(own.body.error.code).toBe('invalid_archive')
  })

  // Last: it fills the tenant's quota, and the space its files took comes back only after the
  // pool's next commit, so a deploy right after it could meet the full quota while unpacking (a
  // clean-clone run's 'refuses bad persist' got invalid_archive, not invalid_manifest).
  it("counts persisted paths in the tenant's quota: a write past it fails like one in /workspace", async () => {
    const big = `head -c ${TENANT_MIB + 16}M /dev/zero`
    const inHome = await run(id, `${big} > ~/.state/big; echo "status $?"; rm -f ~/.state/big`)
    expect(inHome).toContain('Disk quota exceeded')
    expect(inHome).toContain('status 1')
    const inWorkspace = await run(id, `${big} > /workspace/big; echo "status $?"; rm -f /workspace/big`)
    expect(inWorkspace).toContain('Disk quota exceeded')
  })
})
