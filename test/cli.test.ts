import { mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, cliOf, jsonLines, spawnCli, waitFor } from './helpers/cli.js'
import { makeProject } from './helpers/projects.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
let configDir: string
let env: Record<string, string>

const { cairn, json } = cliOf(() => env)

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
    expect((await cairn(['sessions', 'end', short])).stdout).toContain(
      `Session ${short} ended (status: completed). Workspace is preserved.`,
    )
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

    expect(await json(['sessions', 'delete', short, '--yes'])).toEqual({ ok: true, id })
    // A prefix names only sessions not deleted; the full ID shows the deleted one (cli-pipes.test.ts).
    expect((await cairn(['sessions', 'get', short])).code).toBe(1)
    expect((await json(['sessions', 'get', id])).status).toBe('deleted')
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

  it('lists session events and leases a session, with and without --json', async () => {
    const [record] = jsonLines((await cairn(['run', 'echo', '--json', 'eventful', '--single'])).stdout)
    const id = String(record?.sessionId)
    const short = id.slice(0, 12)

    const table = await cairn(['sessions', 'events', short])
    expect(table.code).toBe(0)
    const lines = table.stdout.trimEnd().split('\n')
    expect(lines[0]).toMatch(/^At\s+From → To\s+Cause\s+Detail$/)
    expect(lines[1]).toMatch(/^\d{4}-\d\d-\d\dT\S+Z\s+∅ → idle\s+created$/)
    expect(table.stdout).toMatch(/idle → active\s+turn_started\s+trn_/)
    expect(table.stdout).toMatch(/active → idle\s+turn_completed/)
    const events = await json(['sessions', 'events', short])
    expect(events.map((e: { cause: string }) => e.cause)).toEqual([
      'created',
      'turn_started',
      'turn_completed',
    ])
    expect(events[0]).toMatchObject({ from: null, to: 'idle' })
    expect(events[0].id).toBeTypeOf('string')

    const leased = await cairn(['sessions', 'lease', short, '90s'])
    expect(leased.code).toBe(0)
    expect(leased.stdout).toMatch(/^Leased ses_[a-z0-9]{8} for 1m 30s \(until \d{4}-\S+Z\)\n$/)
    const before = Date.now()
    const lease = await json(['sessions', 'lease', short, '5m'])
    expect(lease).toEqual({ sessionId: id, leaseUntil: expect.any(String) })
    const ahead = Date.parse(lease.leaseUntil) - before
    expect(ahead).toBeGreaterThan(4 * 60_000)
    expect(ahead).toBeLessThanOrEqual(5 * 60_000 + 5_000)
    expect(Date.parse((await json(['sessions', 'lease', short, '2h'])).leaseUntil) - before).toBeGreaterThan(
      7_000_000,
    )

    const bad = await cairn(['sessions', 'lease', short, 'soon'])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('expected a duration')
    expect((await cairn(['sessions', 'lease', short, '500ms'])).code).toBe(1)
    const bare = await cairn(['sessions', 'lease', short, '7200'])
    expect(bare.code).toBe(2)
    expect(bare.stderr).toContain('a duration needs its unit: 7200s')
    const tooLong = await cairn(['sessions', 'lease', short, '2d', '--json'])
    expect(tooLong.code).toBe(1)
    expect(JSON.parse(tooLong.stdout).error.code).toBe('validation_failed')
    expect(JSON.parse((await cairn(['sessions', 'events', 'zzzzzz', '--json'])).stdout).error.code).toBe(
      'session_not_found',
    )
  })

  it('registers, lists, pauses and deletes webhooks, and refuses what it may not send to', async () => {
    // A documentation address (public to the guard) and an event a single server never sends (a
    // node lost, in a cluster only): nothing is delivered.
    const url = 'https://203.0.113.10/hook'
    const created = await cairn(['webhooks', 'create', url, '--events', 'session.node_lost'])
    expect(created.code).toBe(0)
    expect(created.stdout).toMatch(/^whsec_\S+\n$/)
    const id = /Created webhook (whk_[a-z0-9]+)/.exec(created.stderr)?.[1] as string
    expect(created.stderr).toContain('not shown again')
    expect((await cairn(['webhooks', 'list'])).stdout).toMatch(
      new RegExp(`${id}\\s+${url}\\s+session.node_lost\\s+yes`),
    )
    expect(await json(['webhooks', 'update', id, '--no-enable'])).toMatchObject({ id, enabled: false })
    expect(await json(['webhooks', 'deliveries', id])).toEqual([])
    expect((await cairn(['webhooks', 'create', url, '--events', 'turn.exploded'])).code).toBe(2)
    const refused = await cairn([
      'webhooks',
      'create',
      'http://169.254.169.254/',
      '--events',
      'all',
      '--json',
    ])
    expect([refused.code, JSON.parse(refused.stdout).error.code]).toEqual([1, 'webhook_url_forbidden'])
    expect((await cairn(['webhooks', 'delete', id, '--yes'])).code).toBe(0)
    expect(await json(['webhooks'])).toEqual([])
  })

  it('creates, lists and revokes API keys, with and without --json', async () => {
    const created = await cairn(['keys', 'create', '--role', 'read', '--name', 'ci reader'])
    expect(created.code).toBe(0)
    expect(created.stdout).toMatch(/^cairn_sk_\S+\n$/)
    expect(created.stderr).toMatch(/Created read key key_[a-z0-9]+ for tenant tnt_default/)
    expect(created.stderr).toContain('not shown again')
    const readKey = created.stdout.trim()

    const admin = await json(['keys', 'create', '--name', 'robot'])
    expect(admin).toEqual({
      id: expect.stringMatching(/^key_/),
      key: expect.stringMatching(/^cairn_sk_/),
      tenantId: 'tnt_default',
      role: 'admin',
    })

    const table = await cairn(['keys', 'list'])
    expect(table.code).toBe(0)
    const lines = table.stdout.trimEnd().split('\n')
    expect(lines[0]).toMatch(/^ID\s+Prefix\s+Role\s+Name\s+Created\s+Last used\s+Revoked$/)
    expect(table.stdout).toMatch(new RegExp(`${admin.id}\\s+${admin.key.slice(0, 13)}…\\s+admin\\s+robot\\s`))
    expect(table.stdout).toMatch(/\s+read\s+ci reader\s+/)
    expect(table.stdout).not.toContain(admin.key)
    expect(table.stdout).not.toContain(readKey)
    const listed = await json(['keys'])
    const robot = listed.find((k: { id: string }) => k.id === admin.id)
    expect(robot).toMatchObject({
      prefix: admin.key.slice(0, 13),
      role: 'admin',
      name: 'robot',
      revokedAt: null,
    })
    expect(Object.keys(robot).sort()).toEqual(
      ['createdAt', 'id', 'lastUsedAt', 'name', 'prefix', 'revokedAt', 'role', 'tenantId'].sort(),
    )
    expect(JSON.stringify(listed)).not.toContain(admin.key)

    // A read key reads sessions but cannot manage keys.
    expect((await cairn(['sessions', 'list'], { env: { CAIRN_API_KEY: readKey } })).code).toBe(0)
    const forbidden = await cairn(['keys', 'list', '--json'], { env: { CAIRN_API_KEY: readKey } })
    expect(forbidden.code).toBe(1)
    expect(JSON.parse(forbidden.stdout).error.code).toBe('forbidden')
    expect((await cairn(['keys', 'create', '--role', 'owner'])).code).toBe(2)

    // Three active keys now: a bare `key_` matches them all and revokes nothing.
    const ambiguous = await cairn(['keys', 'revoke', 'key_', '--json'])
    expect(ambiguous.code).toBe(1)
    expect(JSON.parse(ambiguous.stdout).error.code).toBe('ambiguous_id')
    // Revoke by a unique prefix of the ID (without key_), then by the full ID with --json.
    const revoked = await cairn(['keys', 'revoke', admin.id.slice(4, 12), '--yes'])
    expect(revoked.code).toBe(0)
    expect(revoked.stdout).toBe(`Revoked key ${admin.id} (robot)\n`)
    const readId = listed.find((k: { name: string | null }) => k.name === 'ci reader').id
    const unconfirmed = await cairn(['keys', 'revoke', readId, '--json'])
    expect(unconfirmed.code).toBe(2)
    expect(JSON.parse(unconfirmed.stdout).error.message).toContain('Nothing revoked')
    expect(await json(['keys', 'revoke', readId, '--yes'])).toEqual({ ok: true, id: readId })
    const refused = await cairn(['sessions', 'list'], { env: { CAIRN_API_KEY: admin.key } })
    expect(refused.code).toBe(1)
    expect(refused.stderr).toContain('cairn login')
    expect(
      (await json(['keys', 'list'])).find((k: { id: string }) => k.id === admin.id).revokedAt,
    ).toBeTypeOf('string')
    expect((await cairn(['keys', 'list'])).stdout).toMatch(new RegExp(`${admin.id}.*(just now|ago)\n`))

    const again = await cairn(['keys', 'revoke', admin.id, '--json', '--yes'])
    expect(again.code).toBe(1)
    expect(JSON.parse(again.stdout).error.code).toBe('not_found')
    const missing = await cairn(['keys', 'revoke', 'zzzzzz', '--yes'])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain("✗ No active API key matching 'zzzzzz'")
    expect(missing.stderr).toContain('cairn keys list')
    // The CLI's own key is untouched.
    expect((await cairn(['sessions', 'list'])).code).toBe(0)
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
