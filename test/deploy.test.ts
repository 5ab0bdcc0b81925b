import { cp, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { SseParser } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { scratchDir } from './helpers/scratch.js'
import { EXAMPLES, packDir, startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
})

afterAll(async () => {
  await t?.close()
})

/** Follows a revision's build log (SSE) to its end. */
async function follow(
  agent: string,
  revision: string,
): Promise<{ lines: string[]; end: { status: string; error: string | null } }> {
  const res = await fetch(`${t.url}/v1/agents/${agent}/revisions/${revision}/logs?follow=true`, {
    headers: { authorization: `Bearer ${t.key}` },
  })
  expect(res.headers.get('content-type')).toContain('text/event-stream')
  const parser = new SseParser()
  const lines: string[] = []
  let end = { status: 'unknown', error: null as string | null }
  for (const { event, data } of [...parser.push(await res.text()), ...parser.end()]) {
    if (event === 'log') lines.push((JSON.parse(data) as { line: string }).line)
    if (event === 'end') end = JSON.parse(data)
  }
  return { lines, end }
}

describe('deploy pipeline', () => {
  it('builds npm dependencies once in a sandbox, and a session of the revision uses them', async () => {
    const res = await t.api.deploy(`${EXAMPLES}/node-deps`)
    expect(res.status).toBe(201)
    expect(res.body.revision.status).toBe('DEPLOYING')
    expect(res.body.revision.envKey).toMatch(/^node-[0-9a-f]{32}$/)
    const { lines, end } = await follow('node-deps', res.body.revision.id)
    expect(end.status, lines.join('\n')).toBe('READY')
    expect(lines.join('\n')).toContain('npm ci')
    const session = await t.api.createSession('node-deps')
    expect((await t.api.send(session.id, '42')).text).toBe('"42" is a number.\n')
    expect((await t.api.send(session.id, 'forty-two')).text).toBe('"forty-two" is not a number.\n')
  })

  it('reuses the environment when only source changed', async () => {
    const dir = await scratchDir('cairn-redeploy-')
    await cp(`${EXAMPLES}/node-deps`, dir, { recursive: true })
    await writeFile(
      path.join(dir, 'agent.mjs'),
      "import readline from 'node:readline'\nimport isNumber from 'is-number'\nfor await (const line of readline.createInterface({ input: process.stdin })) console.log(`v2 ${isNumber(line)}`)\n",
    )
    const res = await t.api.call('POST', '/v1/agents?wait=true', await packDir(dir))
    expect(res.status).toBe(201)
    expect(res.body.revision.status).toBe('READY')
    const log = await t.api.call('GET', `/v1/agents/node-deps/revisions/${res.body.revision.id}/logs`)
    expect(log.body.lines.join('\n')).toContain('reusing environment')
    const detail = await t.api.call('GET', '/v1/agents/node-deps')
    expect(detail.body.revisions).toHaveLength(2)
    expect(detail.body.currentRevisionId).toBe(res.body.revision.id)
    const session = await t.api.createSession('node-deps')
    expect((await t.api.send(session.id, '7')).text).toBe('v2 true\n')
  })

  it('marks a revision whose npm ci fails FAILED with the failing line, and keeps the previous one current', async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: node-deps\ncommand: node agent.mjs\n',
      'agent.mjs': 'console.log(1)\n',
      'package.json': JSON.stringify({
        name: 'broken',
        version: '1.0.0',
        dependencies: { 'cairn-no-such-package-zz9': '1.0.0' },
      }),
    })
    const res = await t.api.call('POST', '/v1/agents?wait=true', await packDir(project))
    expect(res.status).toBe(201)
    expect(res.body.revision.status).toBe('FAILED')
    expect(res.body.revision.error).toMatch(/404|E404|not found/i)
    const detail = await t.api.call('GET', '/v1/agents/node-deps')
    expect(detail.body.currentRevisionId).not.toBe(res.body.revision.id)
    expect(detail.body.revisions[0].status).toBe('FAILED')
  })

  it('runs the setup command in the revision, with network, before sessions start', async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: with-setup\ncommand: bash agent.sh\nsetup: bash setup.sh\n',
      'setup.sh': 'echo "built at setup" > built.txt\necho setup-ran\n',
      'agent.sh': 'while read -r l; do cat built.txt; done\n',
    })
    const res = await t.api.call('POST', '/v1/agents?wait=true', await packDir(project))
    expect(res.body.revision.status).toBe('READY')
    const log = await t.api.call('GET', `/v1/agents/with-setup/revisions/${res.body.revision.id}/logs`)
    expect(log.body.lines).toContain('setup-ran')
    const session = await t.api.createSession('with-setup')
    expect((await t.api.send(session.id, 'go')).text).toBe('built at setup\n')
  })

  it("makes the newest deploy current even when an older deploy's build finishes after it", async () => {
    const agentSh = (tag: string) => `while read -r l; do echo ${tag}; done\n`
    // A's build waits in its setup; B has none, so B is READY when its POST answers, before A is.
    const older = await makeProject({
      'cairn.yaml': 'name: deploy-race\ncommand: bash agent.sh\nsetup: sleep 4\n',
      'agent.sh': agentSh('A'),
    })
    const newer = await makeProject({
      'cairn.yaml': 'name: deploy-race\ncommand: bash agent.sh\n',
      'agent.sh': agentSh('B'),
    })
    const a = await t.api.call('POST', '/v1/agents', await packDir(older))
    expect(a.body.revision.status).toBe('DEPLOYING')
    const b = await t.api.call('POST', '/v1/agents?wait=true', await packDir(newer))
    expect(b.body.revision.status).toBe('READY')
    const aMidway = await t.api.call('GET', `/v1/agents/deploy-race/revisions/${a.body.revision.id}`)
    expect(aMidway.body.status, 'the older build must still be running here').toBe('DEPLOYING')
    const { lines, end } = await follow('deploy-race', a.body.revision.id)
    expect(end.status, lines.join('\n')).toBe('READY')
    const detail = await t.api.call('GET', '/v1/agents/deploy-race')
    expect(detail.body.currentRevisionId).toBe(b.body.revision.id)
    const session = await t.api.createSession('deploy-race')
    expect((await t.api.send(session.id, 'go')).text).toBe('B\n')
  })
})
