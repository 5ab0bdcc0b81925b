import { spawn } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, CLI_BIN, type CliResult, cliOf } from './helpers/cli.js'
import { makeProject } from './helpers/projects.js'
import { EXAMPLES, REPO_ROOT, startTestServer, type TestServer } from './helpers/server.js'

// The CLI as a pipe and a script meet it: a reader that goes away, colour asked for in a pipe, a
// mistyped subcommand, a long deploy with nobody at a terminal, a deleted session by its ID.

let t: TestServer
let configDir: string
let env: Record<string, string>

const { cairn } = cliOf(() => env)
const ESC = '\x1b['

/** Runs the CLI with the read end of one of its output pipes closed before it writes anything. */
function withClosed(stream: 'stdout' | 'stderr', args: string[]): Promise<CliResult> {
  const child = spawn(process.execPath, [CLI_BIN, ...args], {
    env: { ...process.env, NO_COLOR: '1', ...env },
    cwd: REPO_ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  // Closed at once: the child is still starting Node, so its first write meets a closed pipe.
  child[stream].destroy()
  const open = stream === 'stdout' ? child.stderr : child.stdout
  let text = ''
  open.setEncoding('utf8').on('data', (chunk: string) => {
    text += chunk
  })
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000)
  return new Promise((resolve) => {
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      resolve({
        code,
        signal,
        stdout: stream === 'stdout' ? '' : text,
        stderr: stream === 'stderr' ? '' : text,
      })
    })
  })
}

beforeAll(async () => {
  assertBuilt()
  t = await startTestServer()
  configDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-cli-pipes-'))
  env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: configDir }
  expect((await t.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
  await t.api.createSession('echo')
})

afterAll(async () => {
  await t?.close()
  if (configDir) await rm(configDir, { recursive: true, force: true })
})

describe('cairn in a pipe', () => {
  it('ends quietly, status 0, when its stdout is closed (`cairn --help | head -1`), whatever the command', async () => {
    for (const args of [
      ['--help'],
      ['--version'],
      ['completion', 'bash'],
      ['agents', 'list'],
      ['sessions', 'list'],
      ['sessions', 'list', '--json'],
    ]) {
      const r = await withClosed('stdout', args)
      expect(r.stderr, args.join(' ')).toBe('')
      expect(r.code, args.join(' ')).toBe(0)
    }
  })

  it('goes on with a closed stderr: a deploy prints its steps there and still deploys', async () => {
    const r = await withClosed('stderr', ['deploy', `${EXAMPLES}/echo`, '--yes'])
    expect(r.code).toBe(0)
    expect(r.stdout).toMatch(/^Deployed echo \(rev_[a-z0-9]{20}\)\n$/)
  })

  it('colours piped output with FORCE_COLOR=1 or --color (docs/cli.md), and not by default', async () => {
    const plain = { NO_COLOR: undefined, FORCE_COLOR: undefined }
    const forced = await cairn(['agents', 'list'], { env: { ...plain, FORCE_COLOR: '1' } })
    expect(forced.code).toBe(0)
    expect(forced.stdout).toContain(`${ESC}1mName`)
    const flag = await cairn(['agents', 'list', '--color'], { env: plain })
    expect(flag.stdout).toContain(`${ESC}1mName`)
    // The flag wins over NO_COLOR, as --no-color wins over FORCE_COLOR.
    expect((await cairn(['--color', 'agents', 'list'], { env: { NO_COLOR: '1' } })).stdout).toContain(ESC)
    const off = await cairn(['agents', 'list', '--no-color'], { env: { ...plain, FORCE_COLOR: '1' } })
    expect(off.stdout).not.toContain(ESC)
    const auto = await cairn(['agents', 'list'], { env: plain })
    expect(auto.stdout).toMatch(/^Name\s+ID/)
    expect(auto.stdout).not.toContain(ESC)
    // stderr too: the error's ✗ in red.
    const error = await cairn(['sessions', 'get', 'zzzzzz'], { env: { ...plain, FORCE_COLOR: '1' } })
    expect(error.code).toBe(1)
    expect(error.stderr).toContain(`${ESC}31m✗`)
  })

  it('refuses an unknown subcommand with the nearest ones (exit 2), not as an argument of the default', async () => {
    const typo = await cairn(['sessions', 'lst'])
    expect(typo.code).toBe(2)
    expect(typo.stdout).toBe('')
    expect(typo.stderr).toContain("✗ unknown command 'sessions lst'")
    expect(typo.stderr).toContain('Did you mean `cairn sessions list`?')
    const typoJson = await cairn(['sessions', 'delte', 'ses_x', '--json'])
    expect(typoJson.code).toBe(2)
    expect(JSON.parse(typoJson.stdout).error).toMatchObject({
      code: 'usage',
      message: "unknown command 'sessions delte'",
      hint: 'Did you mean `cairn sessions delete`?',
    })
    for (const group of ['agents', 'keys', 'nodes']) {
      const r = await cairn([group, 'lst'])
      expect(r.code, group).toBe(2)
      expect(r.stderr, group).toContain(`Did you mean \`cairn ${group} list\`?`)
    }
    const far = await cairn(['session', 'my-agent'])
    expect(far.code).toBe(2)
    expect(far.stderr).toContain("unknown command 'sessions my-agent'")
    expect(far.stderr).toContain('cairn sessions --help')
    // The words that are commands still work, and a group alone runs its default.
    expect((await cairn(['sessions', 'ls', 'echo'])).stdout).toMatch(/^ID\s+Agent/)
    expect((await cairn(['sessions'])).stdout).toMatch(/^ID\s+Agent/)
  })

  it('prints a deploy’s steps and its build log on stderr, line by line, with no terminal', async () => {
    const dir = await makeProject({
      'cairn.yaml': 'name: built\ncommand: bash agent.sh\nsetup: bash setup.sh\n',
      'agent.sh': 'while IFS= read -r l; do echo "built: $l"; done\n',
      'setup.sh': 'echo "setup: first step"\necho "setup: second step"\n',
    })
    try {
      const r = await cairn(['deploy', dir, '--yes'])
      expect(r.code, r.stderr).toBe(0)
      expect(r.stdout).toMatch(/^Deployed built \(rev_[a-z0-9]{20}\)\n$/)
      const lines = r.stderr.split('\n')
      expect(lines[0]).toBe(`Packing ${dir}…`)
      expect(lines[1]).toMatch(/^Uploading \d+ files, .+ \(.+ compressed\)…$/)
      expect(lines[2]).toMatch(/^Building rev_[a-z0-9]{20}…$/)
      expect(lines).toContain('  setup: first step')
      expect(lines.indexOf('  setup: second step')).toBeGreaterThan(lines.indexOf('  setup: first step'))
      expect(r.stderr).not.toContain('\r')
      expect(r.stderr).not.toContain(ESC)
      // --json: the same lines on stderr, the result alone on stdout.
      const json = await cairn(['deploy', dir, '--yes', '--json'])
      expect(JSON.parse(json.stdout).revision.status).toBe('READY')
      expect(json.stderr).toContain('Building rev_')
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })

  it('shows a deleted session by its full ID (as `list --status deleted` does), saying it is deleted', async () => {
    const { id } = await t.api.createSession('echo')
    expect((await t.api.call('DELETE', `/v1/sessions/${id}`)).status).toBe(200)
    const listed = await cairn(['sessions', 'list', '--status', 'deleted', '--json'])
    expect(JSON.parse(listed.stdout).map((s: { id: string }) => s.id)).toContain(id)

    const shown = await cairn(['sessions', 'get', id])
    expect(shown.code, shown.stderr).toBe(0)
    expect(shown.stdout).toContain(id)
    expect(shown.stdout).toMatch(/^Status: +deleted \(user_delete\)$/m)
    expect(shown.stderr).toContain('This session is deleted')
    const withoutPrefix = await cairn(['sessions', 'get', id.slice(4), '--json'])
    expect(JSON.parse(withoutPrefix.stdout)).toMatchObject({ id, status: 'deleted' })
    // A prefix still names only sessions that are not deleted, as every session argument does.
    const prefix = await cairn(['sessions', 'get', id.slice(0, 14)])
    expect(prefix.code).toBe(1)
    expect(prefix.stderr).toContain(`No session found matching '${id.slice(0, 14)}'`)
    // A full ID nobody has: the same answer.
    const none = await cairn(['sessions', 'get', `ses_${'0'.repeat(20)}`])
    expect(none.code).toBe(1)
    expect(none.stderr).toContain('No session found matching')
  })
})
