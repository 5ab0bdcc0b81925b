import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_AGENT, SHELL_PROJECT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// The session manifest's provenance fields (docs/sessions.md "Manifest"): one server.
let t: TestServer

const GIT = 'git -c user.name=t -c user.email=t@example.com'

beforeAll(async () => {
  t = await startTestServer()
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
  const setUp = await makeProject({
    'cairn.yaml': 'name: prepared\ncommand: bash agent.sh\nsession:\n  setup: echo prepared > prepared.txt\n',
    'agent.sh': SHELL_AGENT,
  })
  expect((await t.api.deploy(setUp)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

const manifestOf = (id: string) => t.api.manifest(id)

describe('provenance in the manifest', () => {
  it('names the git checkout in /workspace: branch and SHA from loose and packed refs, detached, and none', async () => {
    const { id } = await t.api.createSession('shell')
    expect((await t.api.send(id, 'echo plain')).text).toContain('plain')
    expect((await manifestOf(id)).repo).toBeNull()

    const made = await t.api.send(
      id,
      `git init -q -b feature/x && ${GIT} commit -q --allow-empty -m one && git rev-parse HEAD`,
    )
    const sha = /[0-9a-f]{40}/.exec(made.text)?.[0]
    expect(sha, made.text).toBeTruthy()
    expect((await manifestOf(id)).repo).toEqual({ branch: 'feature/x', sha })

    // The ref moved into packed-refs: the same commit, read from there.
    expect(
      (
        await t.api.send(
          id,
          'git pack-refs --all && test ! -e .git/refs/heads/feature/x && grep -c feature/x .git/packed-refs',
        )
      ).text,
    ).toMatch(/^1\n/)
    expect((await manifestOf(id)).repo).toEqual({ branch: 'feature/x', sha })

    expect((await t.api.send(id, 'git checkout -q --detach && echo detached')).text).toContain('detached')
    expect((await manifestOf(id)).repo).toEqual({ branch: null, sha })

    // An unborn branch: named, no commit yet.
    await t.api.send(id, 'rm -rf .git && git init -q -b fresh && echo reset')
    expect((await manifestOf(id)).repo).toEqual({ branch: 'fresh', sha: null })
  })

  it('fills the setup version, newest snapshot, memory version and the last tests the agent reported', async () => {
    const plain = await t.api.createSession('shell')
    await t.api.send(plain.id, 'echo one')
    const before = await manifestOf(plain.id)
    expect(before).toMatchObject({ setupVersion: null, lastTests: null, memoryVersion: 0 })
    expect(before.snapshotId).toBe(before.snapshotIds.at(-1))

    const report = {
      status: 'failed',
      passed: 11,
      failed: 1,
      command: 'npm test',
      at: '2026-11-29T17:00:00Z',
    }
    await t.api.send(plain.id, `mkdir -p .cairn && echo '${JSON.stringify(report)}' > .cairn/last-tests.json`)
    expect((await manifestOf(plain.id)).lastTests).toEqual(report)
    // Not the documented shape: not reported.
    await t.api.send(plain.id, `echo '{"status":"great"}' > .cairn/last-tests.json`)
    expect((await manifestOf(plain.id)).lastTests).toBeNull()

    const agentId = before.agent.id
    for (const content of ['a', 'b'])
      expect((await t.api.call('PUT', `/v1/agents/${agentId}/memory`, { content })).status).toBe(200)
    expect((await manifestOf(plain.id)).memoryVersion).toBe(2)

    const first = await t.api.createSession('prepared')
    const second = await t.api.createSession('prepared')
    for (const s of [first, second])
      expect((await t.api.send(s.id, 'cat prepared.txt')).text).toContain('prepared')
    const [a, b] = [await manifestOf(first.id), await manifestOf(second.id)]
    expect(a.setupVersion).toMatch(/^sha256:[0-9a-f]{64}$/)
    expect(b.setupVersion).toBe(a.setupVersion)
    expect(a.snapshotId).toBe(a.snapshotIds.at(-1))
    expect(a.snapshotIds).toContain(a.sessionSetup.snapshotId)
  })
})
