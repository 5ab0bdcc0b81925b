import { type ChildProcess, execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { Cairn } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, spawnCli } from './helpers/cli.js'
import { createNetnsHost, type NetnsHost, netnsAddresses } from './helpers/netns.js'
import { makeProject, SHELL_AGENT, SHELL_PROJECT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// A git host in its own network namespace (reachable over a veth pair, as in the egress tests)
// serving a repository over HTTP only to requests that carry the token.
const SUBNET = 233
const { address: GIT_HOST } = netnsAddresses(SUBNET)
let netnsHost: NetnsHost | undefined
const TOKEN = 'tok-7f3a9c2e51b84d06'
let gitServer: ChildProcess | undefined
let root = ''
let t: TestServer

const git = (cwd: string, ...args: string[]) => execFileSync('git', args, { cwd, stdio: 'pipe' })

const GIT_SERVER = [
  'import http.server, sys',
  'TOKEN = sys.argv[1]',
  'class H(http.server.SimpleHTTPRequestHandler):',
  '    def do_GET(self):',
  '        if self.headers.get("Authorization") != "Bearer " + TOKEN:',
  '            self.send_response(401); self.send_header("Content-Length", "0"); self.end_headers(); return',
  '        super().do_GET()',
  `http.server.ThreadingHTTPServer(("${GIT_HOST}", 8080), lambda *a: H(*a, directory=sys.argv[2])).serve_forever()`,
].join('\n')

// The setup clones with the token as a header (so it is not written into .git/config).
const CLONE = `test -n "$GIT_TOKEN" || { echo "GIT_TOKEN is not set"; exit 3; }; git -c http.extraHeader="Authorization: Bearer $GIT_TOKEN" clone http://${GIT_HOST}:8080/repo.git repo`

beforeAll(async () => {
  netnsHost = createNetnsHost('setup', SUBNET)
  root = await mkdtemp(path.join(os.tmpdir(), 'cairn-setup-git-'))
  const work = path.join(root, 'work')
  execFileSync('mkdir', ['-p', work])
  git(work, 'init', '-q', '-b', 'main')
  await writeFile(path.join(work, 'README.md'), 'hello from the private repository\n')
  git(work, 'add', '.')
  git(work, '-c', 'user.name=t', '-c', 'user.email=t@example.com', 'commit', '-q', '-m', 'first')
  git(root, 'clone', '-q', '--bare', work, 'repo.git')
  git(path.join(root, 'repo.git'), 'update-server-info')
  await writeFile(path.join(root, 'server.py'), GIT_SERVER)
  gitServer = netnsHost.spawn(['python3', path.join(root, 'server.py'), TOKEN, root], {
    stdio: 'ignore',
  })
  for (let i = 0; i < 50; i++) {
    try {
      execFileSync('curl', [
        '-sf',
        '-H',
        `Authorization: Bearer ${TOKEN}`,
        `http://${GIT_HOST}:8080/repo.git/HEAD`,
      ])
      break
    } catch {
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  t = await startTestServer({ server: { egressPrivateExceptions: [GIT_HOST] } })
  // `cloner` declares the setup in cairn.yaml; `shell` gets one per session through the API.
  const cloner = await makeProject({
    'cairn.yaml': [
      'name: cloner',
      'command: bash agent.sh',
      'session:',
      '  setup:',
      `    command: '${CLONE}'`,
      '    network:',
      `      allow: ["${GIT_HOST}:8080"]`,
      '',
    ].join('\n'),
    'agent.sh': SHELL_AGENT,
  })
  expect((await t.api.deploy(cloner)).status).toBe(201)
  const plain = await makeProject(SHELL_PROJECT)
  expect((await t.api.deploy(plain)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
  gitServer?.kill('SIGKILL')
  netnsHost?.remove()
  if (root) await rm(root, { recursive: true, force: true })
})

const setSecret = (agent: string, scope: string) =>
  t.api.call('PUT', `/v1/agents/${agent}/secrets`, { secrets: { GIT_TOKEN: TOKEN }, scope })

describe('the per-session setup phase', () => {
  it('clones a private repository with a setup secret; the agent phase sees the repo, not the secret', async () => {
    expect((await setSecret('cloner', 'setup')).status).toBeLessThan(300)
    const { id } = await t.api.createSession('cloner')
    const first = await t.api.send(id, 'cat repo/README.md')
    expect(first.text).toBe('hello from the private repository\n[exit 0]\n')
    // The setup wrote the workspace (generation 1, which its snapshot carries); a turn that only
    // read keeps it, a turn that writes moves it (2).
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.generation).toBe(1)
    expect((await t.api.send(id, 'echo notes > notes.txt')).text).toBe('[exit 0]\n')
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.generation).toBe(2)

    // Neither the agent's environment nor any process of its sandbox, nor the workspace, has it.
    expect((await t.api.send(id, 'env | grep -c GIT_TOKEN')).text).toBe('0\n[exit 1]\n')
    const procs = await t.api.send(
      id,
      `cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c -e GIT_TOKEN -e ${TOKEN}`,
    )
    expect(procs.text).toBe('0\n[exit 1]\n')
    expect((await t.api.send(id, 'ls /proc | grep -c "^[0-9]"')).text).not.toBe('0\n[exit 1]\n')
    expect((await t.api.send(id, `grep -rl ${TOKEN} /workspace | wc -l`)).text).toBe('0\n[exit 0]\n')
    // The agent phase has the agent's network policy (none), not the setup's.
    const fetch = await t.api.send(id, `curl -s -m 3 http://${GIT_HOST}:8080/repo.git/HEAD; echo " rc=$?"`)
    expect(fetch.text).not.toContain('ref:')

    const setup = await t.api.call('GET', `/v1/sessions/${id}/setup`)
    expect(setup.body).toMatchObject({ status: 'succeeded', attempts: 1, exitCode: 0 })
    const log = await t.api.call('GET', `/v1/sessions/${id}/setup/log`)
    expect(log.body).toContain("Cloning into 'repo'")
    expect(log.body).not.toContain(TOKEN)
    const snapshots = (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data as {
      id: string
      reason: string
      generation: number
    }[]
    expect(snapshots.map((s) => s.id)).toContain(setup.body.snapshotId)
    const afterSetup = snapshots.find((s) => s.id === setup.body.snapshotId)
    expect(afterSetup).toMatchObject({ reason: 'after_setup', generation: 1 })
    // Setup ran once: later turns do not repeat it.
    expect((await t.api.call('GET', `/v1/sessions/${id}/setup`)).body.attempts).toBe(1)
    const manifest = await t.api.call('GET', `/v1/sessions/${id}/manifest`)
    expect(manifest.body.sessionSetup).toMatchObject({
      status: 'succeeded',
      snapshotId: setup.body.snapshotId,
    })
  })

  it('leaves a session failed with the log tail when setup fails, and runs it again after a fix', async () => {
    const { id } = await t.api.createSession('shell', {
      setup: { command: CLONE, network: { allow: [`${GIT_HOST}:8080`] } },
    })
    const failed = await t.api.send(id, 'cat repo/README.md')
    expect(failed.terminal).toMatchObject({ type: 'run.failed', error: { code: 'setup_failed' } })
    const session = await t.api.call('GET', `/v1/sessions/${id}`)
    expect(session.body).toMatchObject({ status: 'failed', statusCause: 'setup_failed' })
    const events = (await t.api.call('GET', `/v1/sessions/${id}/events`)).body.data as { detail: string }[]
    expect(events.at(-1)?.detail).toContain('GIT_TOKEN is not set')
    expect((await t.api.call('GET', `/v1/sessions/${id}/setup`)).body).toMatchObject({
      status: 'failed',
      exitCode: 3,
      logTail: 'GIT_TOKEN is not set',
    })

    assertBuilt()
    const env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: t.dataDir }
    const shown = await spawnCli(['sessions', 'get', id], env).done
    expect(shown.stdout).toMatch(/Setup:\s+failed \(attempt 1, exit 3\)/)
    expect(shown.stdout).toContain('GIT_TOKEN is not set')

    // The fix: the secret the setup needs. The next message resumes the session and reruns setup.
    expect((await setSecret('shell', 'setup')).status).toBeLessThan(300)
    const retried = await t.api.send(id, 'cat repo/README.md')
    expect(retried.text).toBe('hello from the private repository\n[exit 0]\n')
    expect((await t.api.call('GET', `/v1/sessions/${id}/setup`)).body).toMatchObject({
      status: 'succeeded',
      attempts: 2,
    })
    expect((await t.api.send(id, 'env | grep -c GIT_TOKEN')).text).toBe('0\n[exit 1]\n')
  })

  it('cancels a running setup with the turn; the next message runs it again', async () => {
    const { id } = await t.api.createSession('shell', {
      setup: { command: 'test -e again || { touch again; sleep 60; }; echo done' },
    })
    const first = t.api.send(id, 'echo hi')
    // Cancelled once the command is under way (it has made its mark in the workspace).
    const mark = path.join(t.server.runtime.pool.workspacePath(id), 'again')
    for (let i = 0; i < 400 && !existsSync(mark); i++) await new Promise((r) => setTimeout(r, 25))
    expect((await t.api.call('GET', `/v1/sessions/${id}/setup`)).body.status).toBe('running')
    expect((await t.api.call('POST', `/v1/sessions/${id}/cancel`)).body).toEqual({ ok: true })
    expect((await first).terminal?.type).toBe('run.cancelled')
    expect((await t.api.call('GET', `/v1/sessions/${id}/setup`)).body).toMatchObject({
      status: 'failed',
      error: 'setup was cancelled',
    })
    expect((await t.api.send(id, 'echo hi')).text).toBe('hi\n[exit 0]\n')
    expect((await t.api.call('GET', `/v1/sessions/${id}/setup`)).body).toMatchObject({
      status: 'succeeded',
      attempts: 2,
    })
  })

  it('takes a setup through the SDK, with plain env values, and answers 404 for a session without one', async () => {
    const client = new Cairn({ apiKey: t.key, baseUrl: t.url })
    const session = await client.sessions.create('shell', {
      setup: {
        command: ['sh', '-c', 'echo "$GREETING" > greeting.txt; echo wrote it'],
        env: { GREETING: 'hi there' },
      },
    })
    expect((await session.run('cat greeting.txt')).text).toBe('hi there\n[exit 0]\n')
    expect(await session.setupLog()).toBe('wrote it\n')
    expect((await session.setup()).status).toBe('succeeded')
    const { id } = await t.api.createSession('shell')
    expect((await t.api.call('GET', `/v1/sessions/${id}/setup`)).status).toBe(404)
  })
})
