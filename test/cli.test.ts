import { mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, type CliOptions, jsonLines, spawnCli, waitFor } from './helpers/cli.js'
import { makeProject } from './helpers/projects.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
let configDir: string
let env: Record<string, string>

const cairn = (args: string[], options: CliOptions = {}) => spawnCli(args, env, options).done
const json = async (args: string[], options: CliOptions = {}) => {
  const r = await cairn([...args, '--json'], options)
  expect(r.stderr).not.toContain('✗')
  expect(r.code).toBe(0)
  return JSON.parse(r.stdout)
}

beforeAll(async () => {
  assertBuilt()
  t = await startTestServer()
  configDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-cli-config-'))
  env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: configDir }
})

afterAll(async () => {
  await t?.close()
  if (configDir) await rm(configDir, { recursive: true, force: true })
})

describe('cairn CLI against a real server', () => {
  it('prints help and version, and exits 2 on usage errors', async () => {
    const help = await cairn(['--help'])
    expect(help.code).toBe(0)
    expect(help.stdout).toContain('sessions')
    expect((await cairn(['--version'])).stdout.trim()).toBe('0.1.0')
    const unknown = await cairn(['sesions', 'list'])
    expect(unknown.code).toBe(2)
    expect(unknown.stderr).toContain('✗')
    expect((await cairn(['run'])).code).toBe(2)
    expect((await cairn(['sessions', 'list', '--limit', 'x'])).code).toBe(2)
  })

  it('deploys a directory, with and without --json', async () => {
    const text = await cairn(['deploy', `${EXAMPLES}/echo`, '--yes'])
    expect(text.code).toBe(0)
    expect(text.stdout).toMatch(/^Deployed echo \(rev_[a-z0-9]{20}\)\n$/)
    const result = await json(['deploy', '--dir', `${EXAMPLES}/echo`])
    expect(result.agent.name).toBe('echo')
    expect(result.revision).toMatchObject({ status: 'READY', agentId: result.agent.id })
  })

  it('deploys a bare entry file with a generated cairn.yaml', async () => {
    const dir = await makeProject({
      'bot.sh': 'while IFS= read -r l; do echo "bot: $l"; done\n',
      '.env': 'X=1',
    })
    try {
      const deployed = await json(['deploy', path.join(dir, 'bot.sh'), '--name', 'bot'])
      expect(deployed.agent).toMatchObject({ name: 'bot', command: ['bash', 'bot.sh'], protocol: 'stdio' })
      expect(deployed.revision.fileCount).toBeLessThanOrEqual(3)
      const reply = await cairn(['run', 'bot', 'hi', '--single'])
      expect(reply.stdout).toBe('bot: hi\n')
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })

  it('lists and shows agents', async () => {
    const list = await cairn(['agents', 'list'])
    expect(list.stdout).toMatch(/^Name\s+ID\s+Command/)
    expect(list.stdout).toContain('echo')
    const agents = await json(['agents', 'list'])
    expect(agents.map((a: { name: string }) => a.name)).toContain('echo')
    const detail = await json(['agents', 'get', 'echo'])
    expect(detail.revisions.length).toBeGreaterThanOrEqual(2)
    const missing = await cairn(['agents', 'get', 'nope'])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain('cairn agents list')
  })

  it('runs one turn with --single, leaving the session to resume', async () => {
    const r = await cairn(['run', 'echo', 'hello there', '--single'])
    expect(r.code).toBe(0)
    expect(r.stdout).toBe('hello there\n')
    expect(r.stderr).toMatch(/Resume with: cairn sessions resume ses_[a-z0-9]{8}\n/)
    const [record] = jsonLines((await cairn(['run', 'echo', '--json', 'hi', '--single'])).stdout)
    expect(record).toMatchObject({ turn: 1, finishReason: 'completed' })
    expect(String(record?.text).trim()).toBe('hi')
    expect(record?.sessionId).toMatch(/^ses_/)
    expect(record?.durationMs).toBeTypeOf('number')
  })

  it('sends each piped line as a turn, in one session', async () => {
    const r = await cairn(['run', 'echo', '--json'], { input: 'one\n\ntwo\nthree\n' })
    expect(r.code).toBe(0)
    const records = jsonLines(r.stdout)
    expect(records.map((x) => x.turn)).toEqual([1, 2, 3])
    expect(records.map((x) => String(x.text).trim())).toEqual(['one', 'two', 'three'])
    expect(new Set(records.map((x) => x.sessionId)).size).toBe(1)
    const plain = await cairn(['run', 'echo'], { input: 'a\nb\nexit\nc\n' })
    expect(plain.stdout).toBe('a\nb\n')
  })

  it('lists, shows, ends, resumes and deletes sessions by unique prefix', async () => {
    const [first] = jsonLines((await cairn(['run', 'echo', '--json', 'remember this', '--single'])).stdout)
    const id = String(first?.sessionId)
    const short = id.slice(0, 12)

    const table = await cairn(['sessions', 'list', '--agent', 'echo'])
    expect(table.stdout.split('\n')[0]).toMatch(/^ID\s+Agent\s+Title\s+Status\s+Msgs\s+Last Active$/)
    expect(table.stdout).toContain(short)
    expect(table.stdout).not.toContain(id)
    const listed = await json(['sessions', 'list', '--limit', '2'])
    expect(listed).toHaveLength(2)
    expect(
      (await json(['sessions', 'list', '--status', 'idle'])).every(
        (s: { status: string }) => s.status === 'idle',
      ),
    ).toBe(true)

    const shown = await cairn(['sessions', 'get', short])
    expect(shown.stdout).toContain(id)
    expect(await json(['sessions', 'get', id.slice(4, 14)])).toMatchObject({
      id,
      title: 'remember this',
      turnCount: 1,
    })

    const messages = await json(['sessions', 'messages', short])
    expect(messages.map((m: { role: string }) => m.role)).toEqual(['user', 'assistant'])
    expect((await cairn(['sessions', 'messages', short])).stdout).toMatch(
      /^You> remember this\nAgent> remember this\n$/,
    )

    expect(await json(['sessions', 'end', short])).toMatchObject({ id, status: 'completed' })
    expect((await cairn(['sessions', 'end', short])).stdout).toContain(`Ended session ${short}`)
    expect(await json(['sessions', 'resume', short])).toMatchObject({ id, status: 'idle' })
    const resumed = await cairn(['sessions', 'resume', short])
    expect(resumed.code).toBe(0)
    expect(resumed.stdout).toContain('Resumed: "remember this" (echo)')
    const again = await cairn(['sessions', 'resume', short], { input: 'still here\n' })
    expect(again.stdout).toContain('still here\n')

    const more = await cairn(['run', 'echo', '--session', short, 'and more', '--single', '--json'])
    expect(jsonLines(more.stdout)[0]).toMatchObject({ sessionId: id, turn: 3 })
    const wrongAgent = await cairn(['run', 'bot', '--session', short, 'x', '--single'])
    expect(wrongAgent.code).toBe(1)

    expect(await json(['sessions', 'delete', short])).toEqual({ ok: true, id })
    const gone = await cairn(['sessions', 'get', id])
    expect(gone.code).toBe(1)
  })

  it('explains missing and ambiguous prefixes with the server messages', async () => {
    const missing = await cairn(['sessions', 'get', 'zzzzzz'])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain("✗ No session found matching 'zzzzzz'")
    expect(missing.stderr).toContain('cairn sessions list')
    expect(missing.stderr).not.toContain('agents')
    const missingJson = await cairn(['sessions', 'get', 'zzzzzz', '--json'])
    expect(JSON.parse(missingJson.stdout).error.code).toBe('session_not_found')

    await cairn(['run', 'echo', 'x', '--single'])
    await cairn(['run', 'echo', 'y', '--single'])
    const ambiguous = await cairn(['sessions', 'resume', 'ses_'])
    expect(ambiguous.code).toBe(1)
    expect(ambiguous.stderr).toMatch(/✗ Ambiguous ID 'ses_' — matches: ses_/)
    expect(ambiguous.stderr).toContain('more characters')
    const ambiguousJson = await cairn(['--json', 'sessions', 'end', 'ses_'])
    expect(JSON.parse(ambiguousJson.stdout).error.code).toBe('ambiguous_id')
  })

  it('watches a session until it is deleted', async () => {
    const [record] = jsonLines((await cairn(['run', 'echo', '--json', 'watch me', '--single'])).stdout)
    const id = String(record?.sessionId)
    const watch = spawnCli(['sessions', 'watch', id, '--json', '--interval', '100'], env)
    await waitFor(() => watch.output().stdout.includes('turn_completed'), 20_000, 'watch output')
    await cairn(['sessions', 'delete', id, '--yes'])
    const result = await watch.done
    expect(result.code).toBe(0)
    const events = jsonLines(result.stdout)
    expect(events[0]).toMatchObject({ to: 'idle', cause: 'created' })
    expect(events.at(-1)).toMatchObject({ to: 'deleted' })
  })

  it('refuses a wrong key with a login hint, and logs in and out', async () => {
    const refused = await cairn(['sessions', 'list'], { env: { CAIRN_API_KEY: 'wrong' } })
    expect(refused.code).toBe(1)
    expect(refused.stderr).toContain('cairn login')
    const bad = await cairn(['login', '--api-key', 'wrong'])
    expect(bad.code).toBe(1)

    const login = await json(['login', '--api-key', t.key, '--api-url', t.url], {
      env: { CAIRN_API_KEY: undefined },
    })
    expect(login.credentialsPath).toBe(path.join(configDir, 'credentials.json'))
    expect(JSON.parse(await readFile(login.credentialsPath, 'utf8'))).toEqual({
      apiUrl: t.url,
      apiKey: t.key,
    })
    const saved = { CAIRN_API_KEY: undefined, CAIRN_API_URL: undefined }
    expect((await cairn(['sessions', 'list'], { env: saved })).code).toBe(0)
    expect(await json(['logout'], { env: saved })).toMatchObject({ removed: true })
    expect((await cairn(['sessions', 'list'], { env: saved })).code).toBe(1)
  })

  it('writes a cairn.yaml with init', async () => {
    const dir = await makeProject({ 'agent.py': 'print(input())\n' })
    try {
      const r = await json(['init', '--name', 'py-agent'], { cwd: dir })
      expect(r).toMatchObject({ name: 'py-agent', command: ['python3', 'agent.py'], protocol: 'stdio' })
      const yaml = await readFile(path.join(dir, 'cairn.yaml'), 'utf8')
      expect(yaml).toContain('name: py-agent\n')
      expect(yaml).toContain('command: python3 agent.py\n')
      expect((await cairn(['init'], { cwd: dir })).code).toBe(1)
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })
})
