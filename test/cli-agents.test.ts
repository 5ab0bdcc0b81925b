import { execFileSync } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, cliOf } from './helpers/cli.js'
import { makeProject } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
let configDir: string
let env: Record<string, string>
const cleanup: string[] = []

const { cairn, json } = cliOf(() => env)
const project = async (files: Record<string, string>) => {
  const dir = await makeProject(files)
  cleanup.push(dir)
  return dir
}

beforeAll(async () => {
  assertBuilt()
  t = await startTestServer()
  configDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-cli-config-'))
  cleanup.push(configDir)
  env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: configDir }
})

afterAll(async () => {
  await t?.close()
  for (const dir of cleanup) await rm(dir, { recursive: true, force: true })
})

describe('agents, builds and secrets from the CLI', () => {
  it('follows a build with a setup step and shows its log', async () => {
    const dir = await project({
      'cairn.yaml': 'name: built\ncommand: bash agent.sh\nsetup: bash setup.sh\n',
      'setup.sh': 'echo "building now"\necho ok > built.txt\n',
      'agent.sh': 'while IFS= read -r l; do echo "$(cat built.txt) $l"; done\n',
    })
    const deployed = await cairn(['deploy', dir])
    expect(deployed.code).toBe(0)
    expect(deployed.stdout).toMatch(/^Deployed built \(rev_[a-z0-9]+\)\n$/)
    expect((await cairn(['run', 'built', 'hi', '--single'])).stdout).toBe('ok hi\n')
    const logs = await cairn(['agents', 'logs', 'built'])
    expect(logs.stdout).toContain('building now')
    const logJson = await json(['agents', 'logs', 'built'])
    expect(logJson).toMatchObject({ status: 'READY', error: null })
  })

  it('reports a failed build with the tail of its log and exit 1', async () => {
    const dir = await project({
      'cairn.yaml': 'name: broken\ncommand: bash agent.sh\nsetup: bash setup.sh\n',
      'setup.sh': 'echo "about to fail"\nexit 3\n',
      'agent.sh': 'cat\n',
    })
    const text = await cairn(['deploy', dir])
    expect(text.code).toBe(1)
    expect(text.stderr).toContain('about to fail')
    expect(text.stderr).toMatch(/✗ The build of rev_[a-z0-9]+ failed/)
    const asJson = await cairn(['deploy', dir, '--json'])
    expect(asJson.code).toBe(1)
    expect(JSON.parse(asJson.stdout).revision.status).toBe('FAILED')
  })

  it('gates sessions on required secrets and manages them', async () => {
    const dir = await project({
      'cairn.yaml':
        'name: secretive\ncommand: bash agent.sh\nsecrets: [API_TOKEN]\nnetwork:\n  allow: [api.example.com, "*.example.org:8443"]\n',
      'agent.sh': 'while IFS= read -r l; do echo "token has $(printf %s "$API_TOKEN" | wc -c) chars"; done\n',
    })
    expect((await cairn(['deploy', dir])).code).toBe(0)
    const blocked = await cairn(['run', 'secretive', 'hi', '--single'])
    expect(blocked.code).toBe(1)
    expect(blocked.stderr).toContain('API_TOKEN')
    expect(blocked.stderr).toContain('cairn secrets set')
    expect(await json(['secrets', 'list', 'secretive'])).toEqual({ data: [], missing: ['API_TOKEN'] })
    expect((await cairn(['secrets', 'list', 'secretive'])).stdout).toMatch(/API_TOKEN\s+-\s+missing/)

    const set = await cairn(['secrets', 'set', 'secretive', 'API_TOKEN=abc123'])
    expect(set.stdout).toBe('Set API_TOKEN for secretive\n')
    expect((await cairn(['run', 'secretive', 'hi', '--single'])).stdout).toBe('token has 6 chars\n')
    const piped = await json(['secrets', 'set', 'secretive', 'OTHER'], { input: 'from-stdin\n' })
    expect(piped.data.map((s: { name: string }) => s.name).sort()).toEqual(['API_TOKEN', 'OTHER'])
    const listed = await cairn(['secrets', 'list', 'secretive'])
    expect(listed.stdout).not.toContain('abc123')
    expect(await json(['secrets', 'delete', 'secretive', 'OTHER'])).toEqual({ ok: true, name: 'OTHER' })
    const scoped = await json(['secrets', 'set', 'secretive', 'BUILD_KEY=b1', '--scope', 'setup'])
    expect(scoped.data.map((s: { name: string; scope: string }) => `${s.name}:${s.scope}`)).toEqual([
      'API_TOKEN:runtime',
      'BUILD_KEY:setup',
    ])
    expect((await cairn(['secrets', 'list', 'secretive'])).stdout).toMatch(/BUILD_KEY\s+setup/)
    expect((await cairn(['secrets', 'set', 'secretive', 'X=1', '--scope', 'everywhere'])).code).toBe(2)
    const proxied = ['secrets', 'set', 'secretive', 'P=v', '--scope', 'proxy', '--host', 'api.example.com']
    const withHosts = await json([...proxied, '--host', '*.example.org:8443'])
    expect(withHosts.data.find((s: { name: string }) => s.name === 'P').hosts).toEqual([
      'api.example.com',
      '*.example.org:8443',
    ])
    expect((await cairn(['secrets', 'list', 'secretive'])).stdout).toMatch(
      /P\s+proxy → api\.example\.com, \*\.example\.org:8443/,
    )
    expect((await cairn(['secrets', 'set', 'secretive', 'P=v', '--scope', 'proxy'])).code).not.toBe(0)
    const withHeader = await json([...proxied, '--header', 'X-Token'])
    expect(withHeader.data.find((s: { name: string }) => s.name === 'P').headers).toEqual(['x-token'])
    const outside = await cairn([
      'secrets',
      'set',
      'secretive',
      'Q=v',
      '--scope',
      'proxy',
      '--host',
      'x.test',
    ])
    expect(outside.code).not.toBe(0)
    expect(outside.stderr).toContain('proxy secret Q is bound to x.test')
    expect(await json(['secrets', 'delete', 'secretive', 'P'])).toEqual({ ok: true, name: 'P' })
    expect(await json(['secrets', 'delete', 'secretive', 'BUILD_KEY'])).toEqual({
      ok: true,
      name: 'BUILD_KEY',
    })
    expect((await cairn(['secrets', 'set', 'secretive', '1BAD=x'])).code).toBe(2)
  })

  it('deletes an agent', async () => {
    const dir = await project({ 'doomed.sh': 'cat\n' })
    const { agent } = await json(['deploy', dir, '--name', 'doomed'])
    expect(await json(['agents', 'delete', 'doomed', '--yes'])).toEqual({
      ok: true,
      id: agent.id,
      name: 'doomed',
    })
    const gone = await cairn(['agents', 'get', 'doomed'])
    expect(gone.code).toBe(1)
    expect(gone.stderr).toContain('cairn agents list')
  })

  it('prints completion scripts bash can load', async () => {
    const bash = await cairn(['completion', 'bash'])
    expect(bash.code).toBe(0)
    execFileSync('bash', ['-n'], { input: bash.stdout })
    expect(bash.stdout).toContain('"sessions:resume")')
    expect((await cairn(['completion', 'zsh'])).stdout).toContain('#compdef cairn')
    expect((await cairn(['completion', 'fish'])).code).toBe(2)
  })
})
