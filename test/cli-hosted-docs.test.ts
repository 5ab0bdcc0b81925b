/**
 * The hosted agent-session product's docs (/work/shared/reference/hosted-docs-*.txt), walked through
 * as written with `cairn` in place of the product's CLI and `@cairn/sdk` in place of its SDK: each
 * test quotes the command or code from the docs and checks that it does what the docs say.
 */
import { execFile, execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import Cairn, { ValidationError } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, CLI_BIN, cliOf, waitFor } from './helpers/cli.js'
import { makeProject } from './helpers/projects.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

const DAY_MS = 86_400_000
const execFileAsync = promisify(execFile)

let t: TestServer
let work: string
let bin: string
let env: Record<string, string>
/** How far the server's clock is set back: sessions created meanwhile were last active then. */
let clockBackMs = 0

const { cairn, json } = cliOf(() => env)
/** A session of `agent` created with the server's clock set back by `backMs`. */
async function sessionAt(agent: string, backMs: number, title?: string): Promise<string> {
  clockBackMs = backMs
  try {
    const client = new Cairn({ baseUrl: t.url, apiKey: t.key })
    return (await client.createSession(agent, { title })).id
  } finally {
    clockBackMs = 0
  }
}
/** Runs a shell line with `cairn` on the PATH, as in the docs (async: the server runs in this process). */
async function sh(line: string): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await execFileAsync('bash', ['-o', 'pipefail', '-c', line], {
      env: { ...process.env, ...env, NO_COLOR: '1', PATH: `${bin}:${process.env.PATH}` },
      encoding: 'utf8',
    })
    return { code: 0, stdout, stderr }
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string }
    return { code: e.code, stdout: e.stdout, stderr: e.stderr }
  }
}

const hasTools = (() => {
  try {
    execFileSync('tmux', ['-V'], { stdio: 'ignore' })
    execFileSync('jq', ['--version'], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
})()

beforeAll(async () => {
  assertBuilt()
  t = await startTestServer({ server: { clock: { now: () => Date.now() - clockBackMs } } })
  work = await mkdtemp(path.join(os.tmpdir(), 'cairn-hosted-docs-'))
  bin = path.join(work, 'bin')
  execFileSync('mkdir', ['-p', bin])
  await writeFile(path.join(bin, 'cairn'), `#!/bin/sh\nexec '${process.execPath}' '${CLI_BIN}' "$@"\n`)
  await chmod(path.join(bin, 'cairn'), 0o755)
  env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: work }
  for (const name of ['my-agent', 'code-agent']) {
    const r = await cairn(['deploy', `${EXAMPLES}/echo`, '--name', name, '--yes'])
    expect(r.code).toBe(0)
  }
})

afterAll(async () => {
  await t?.close()
  if (work) await rm(work, { recursive: true, force: true })
})

describe('docs: superserve sessions list', () => {
  it('`sessions list my-agent` lists the sessions of that agent (the agent as a positional filter)', async () => {
    const mine = await sessionAt('my-agent', 0, 'Review auth module error handling')
    const theirs = await sessionAt('code-agent', 0, 'Review PR #123')
    const r = await cairn(['sessions', 'list', 'my-agent'])
    expect(r.code).toBe(0)
    expect(r.stdout).toContain(mine.slice(0, 12))
    expect(r.stdout).not.toContain(theirs.slice(0, 12))
    const listed = await json(['sessions', 'list', 'my-agent'])
    expect(listed.every((s: { agentName: string }) => s.agentName === 'my-agent')).toBe(true)
    // The same as --agent; two different agents are a usage error.
    expect((await json(['sessions', 'list', '--agent', 'my-agent'])).length).toBe(listed.length)
    expect((await cairn(['sessions', 'list', 'my-agent', '--agent', 'code-agent'])).code).toBe(2)
  })

  it('`--status ended` lists the sessions ended by their user; an empty filtered list says the filter matched nothing', async () => {
    const id = await sessionAt('code-agent', 0, 'to be ended')
    const none = await cairn(['sessions', 'list', 'code-agent', '--status', 'ended'])
    expect(none.code).toBe(0)
    expect(none.stderr).toContain("No session matches agent 'code-agent' and status 'completed'")
    expect(none.stderr).not.toContain('No sessions yet')
    const ended = await cairn(['sessions', 'end', id])
    expect(ended.code).toBe(0)
    expect(ended.stdout).toContain('ended (status: completed). Workspace is preserved.')
    const listed = await json(['sessions', 'list', '--status', 'ended'])
    expect(listed.map((s: { id: string }) => s.id)).toContain(id)
    expect(listed.every((s: { status: string }) => s.status === 'completed')).toBe(true)
    for (const status of ['active', 'idle', 'IDLE', 'timeout'])
      expect((await cairn(['sessions', 'list', '--status', status])).code, status).toBe(0)
    const bad = await cairn(['sessions', 'list', '--status', 'finished'])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('ended (= completed)')
  })

  it('LAST ACTIVE reads "2 minutes ago"', async () => {
    const id = await sessionAt('code-agent', 2 * 60_000 + 10_000, 'two minutes old')
    const r = await cairn(['sessions', 'list', 'code-agent'])
    expect(r.stdout).toMatch(new RegExp(`${id.slice(0, 12)}.*2 minutes ago`))
  })
})

describe('docs: idle timeouts', () => {
  it('`createSession(agent, { title, idleTimeout: 3600 })` is an hour, in seconds as in the docs', async () => {
    const client = new Cairn({ baseUrl: t.url, apiKey: t.key })
    const session = await client.createSession('my-agent', {
      title: 'Debug authentication module',
      idleTimeout: 3600, // 1 hour
    })
    expect(session.info.idleTimeoutMs).toBe(3_600_000)
    expect(session.info.title).toBe('Debug authentication module')
    const longRunning = await client.createSession('my-agent', {
      title: 'Q1 product planning',
      idleTimeout: 60 * 60 * 24 * 30, // 30 days
    })
    expect(longRunning.info.idleTimeoutMs).toBe(30 * DAY_MS)
  })

  it('an option the SDK does not know is refused, never dropped, and creates nothing', async () => {
    const client = new Cairn({ baseUrl: t.url, apiKey: t.key })
    const before = (await json(['sessions', 'list', 'my-agent', '--limit', '500'])).length
    const options = { title: 'typo', idleTimout: 3600 }
    await expect(client.createSession('my-agent', options)).rejects.toThrow(ValidationError)
    await expect(client.createSession('my-agent', options)).rejects.toThrow(
      "unknown option 'idleTimout' for createSession; did you mean 'idleTimeout'?",
    )
    await expect(
      client.createSession('my-agent', { idleTimeout: 3600, idleTimeoutMs: 1000 }),
    ).rejects.toThrow('not both')
    const run = { message: 'Hello', idleTimeot: 7200 }
    await expect(client.run('my-agent', run)).rejects.toThrow("did you mean 'idleTimeout'?")
    expect((await json(['sessions', 'list', 'my-agent', '--limit', '500'])).length).toBe(before)
  })

  it('`cairn run --idle-timeout 3600` is refused for want of a unit; `1h` and `3600s` are an hour', async () => {
    const bare = await cairn(['run', 'my-agent', 'hi', '--single', '--idle-timeout', '3600'])
    expect(bare.code).toBe(2)
    expect(bare.stderr).toContain('a duration needs its unit: 3600s (seconds)')
    for (const value of ['1h', '3600s']) {
      const r = await cairn(['run', 'my-agent', 'hi', '--single', '--idle-timeout', value, '--json'])
      expect(r.code).toBe(0)
      const sessionId = JSON.parse(r.stdout.split('\n')[0] as string).sessionId
      expect((await json(['sessions', 'get', sessionId])).idleTimeoutMs).toBe(3_600_000)
    }
  })
})

describe('docs: the SDK as imported there', () => {
  it('`import Cairn from "@cairn/sdk"`: a session, two runs, a stream, end', async () => {
    const client = new Cairn({ apiKey: t.key, baseUrl: t.url })
    const session = await client.createSession('my-agent')
    const r1 = await session.run('What files handle authentication?')
    const r2 = await session.run('Add rate limiting to the login endpoint')
    expect(r1.text).toBe('What files handle authentication?\n')
    expect(r2.text).toBe('Add rate limiting to the login endpoint\n')
    const stream = session.stream('Run the tests')
    let streamed = ''
    for await (const chunk of stream.textStream) streamed += chunk
    expect(streamed).toBe('Run the tests\n')
    await session.end()
    expect(session.status).toBe('completed')
  })

  it('`client.run("my-agent", { message })`: each run a fresh session, the answer returned', async () => {
    const client = new Cairn({ apiKey: t.key, baseUrl: t.url })
    // Each run creates a new session
    const a = await client.run('my-agent', { message: "What's 2 + 2?" })
    const b = await client.run('my-agent', { message: "What's 5 * 3?" })
    expect(a.text).toBe("What's 2 + 2?\n")
    expect(b.text).toBe("What's 5 * 3?\n")
    expect(a.sessionId).not.toBe(b.sessionId)
    // Or when sending a message
    const c = await client.run('my-agent', { message: 'Hello', idleTimeout: 7200 })
    expect(c.text).toBe('Hello\n')
    // With an existing session, options of a new one are refused rather than dropped.
    const session = await client.createSession('my-agent')
    await expect(
      client.run('my-agent', { message: 'x', sessionId: session.id, idleTimeout: 7200 }),
    ).rejects.toThrow('applies to a new session')
  })
})

describe('docs: "You send a message without a sessionId (auto-creates one)"', () => {
  const send = async (body: Record<string, unknown>) => {
    const res = await fetch(`${t.url}/v1/messages`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.key}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    })
    return { status: res.status, sessionId: res.headers.get('cairn-session-id'), text: await res.text() }
  }

  it('POST /v1/messages without a sessionId creates a session and answers in it; with one, continues it', async () => {
    const first = await send({ agent: 'my-agent', prompt: 'Hello', idleTimeoutMs: 7_200_000 })
    expect(first.status).toBe(200)
    expect(first.sessionId).toMatch(/^ses_/)
    expect(first.text).toContain(`"sessionId":"${first.sessionId}"`)
    expect(first.text).toContain('event: run.completed')
    const session = await json(['sessions', 'get', String(first.sessionId)])
    expect(session).toMatchObject({ agentName: 'my-agent', turnCount: 1, idleTimeoutMs: 7_200_000 })
    const again = await send({ agent: 'my-agent', prompt: 'Again', sessionId: first.sessionId })
    expect(again.status).toBe(200)
    expect(again.sessionId).toBe(first.sessionId)
    expect((await json(['sessions', 'get', String(first.sessionId)])).turnCount).toBe(2)
    // Options of a new session with an existing one, or another agent's session: refused, not ignored.
    expect(
      (await send({ agent: 'my-agent', prompt: 'x', sessionId: first.sessionId, title: 't' })).status,
    ).toBe(400)
    expect((await send({ agent: 'code-agent', prompt: 'x', sessionId: first.sessionId })).status).toBe(400)
  })
})

describe('messages on the way: each says what happened and what to do', () => {
  it('a crash names the exception, not the middle of a traceback', async () => {
    const dir = await makeProject({
      'cairn.yaml': 'name: crashy\ncommand: python3 crashy.py\n',
      'crashy.py': 'while True:\n    line = input()\n    print(len(line) / (line != "crash"))\n',
    })
    try {
      expect((await cairn(['deploy', dir, '--yes'])).code).toBe(0)
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
    const r = await cairn(['run', 'crashy', 'crash', '--single'])
    expect(r.code).toBe(1)
    expect(r.stderr).toMatch(/✗ the agent exited with code 1: ZeroDivisionError: (float )?division by zero\n/)
    expect(r.stderr).not.toMatch(/\^\^|~~|Traceback/)
    expect(r.stderr).toMatch(/fix the agent, `cairn deploy` it, then `cairn sessions resume ses_[a-z0-9]{8}`/)
  })

  it('a session past its turn limit says so in words, and how to allow more', async () => {
    const first = await cairn(['run', 'my-agent', 'one', '--single', '--max-turns', '1', '--json'])
    expect(first.code).toBe(0)
    const id = JSON.parse(first.stdout.split('\n')[0] as string).sessionId
    const second = await cairn(['run', 'my-agent', '--session', id, 'two', '--single'])
    expect(second.code).toBe(1)
    expect(second.stderr).toContain('has had its one turn (policy maxTurns 1)')
    expect(second.stderr).not.toContain('1 turns')
    expect(second.stderr).toContain('--max-turns')
  })

  it('a turn past the turn timeout says which limit and how to go on, not "try again"', async () => {
    const dir = await makeProject({
      'cairn.yaml': 'name: sleepy\ncommand: bash sleepy.sh\nlimits: { turnTimeoutMs: 1000 }\n',
      'sleepy.sh': 'while IFS= read -r line; do sleep 5; echo "$line"; done\n',
    })
    try {
      expect((await cairn(['deploy', dir, '--yes'])).code).toBe(0)
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
    const r = await cairn(['run', 'sleepy', 'hello', '--single'])
    expect(r.code).toBe(1)
    expect(r.stderr).toContain("ran past the agent's turn timeout (1 s, limits.turnTimeoutMs)")
    expect(r.stderr).toMatch(/cairn sessions resume ses_[a-z0-9]{8}/)
    expect(r.stderr).not.toContain('try again')
  })
})

describe('docs: deleting sessions', () => {
  it.skipIf(!hasTools)(
    'the cleanup recipe fails safe as written and, with --yes, deletes only the sessions last active before the date',
    async () => {
      const now = Date.now()
      const old = [
        await sessionAt('my-agent', now - Date.parse('2025-01-10T12:00:00Z'), 'old one'),
        await sessionAt('my-agent', now - Date.parse('2025-01-31T12:00:00Z'), 'old two'),
      ]
      const recent = await sessionAt('my-agent', now - Date.parse('2025-02-02T12:00:00Z'), 'recent')
      const current = await sessionAt('my-agent', 0, 'current')
      const ids = async () =>
        new Set(
          (await json(['sessions', 'list', 'my-agent', '--limit', '500'])).map((s: { id: string }) => s.id),
        )
      const recipe = `cairn sessions list my-agent --json | \\
  jq -r '.[] | select(.last_activity_at < "2025-02-01") | .id' | \\
  xargs -I {} cairn sessions delete {}`
      // As written: xargs gives `delete` no terminal, so nothing is deleted, and it says why.
      const asWritten = await sh(recipe)
      expect(asWritten.code).not.toBe(0)
      expect(asWritten.stderr).toContain('Add --yes')
      for (const id of [...old, recent, current]) expect(await ids()).toContain(id)
      // The selection is on the real date: only the two old sessions.
      const selected = await sh(recipe.replace(/ \| \\\n {2}xargs.*$/, ''))
      expect(selected.stdout.trim().split('\n').sort()).toEqual([...old].sort())
      const withYes = await sh(`${recipe} --yes`)
      expect(withYes.code).toBe(0)
      const left = await ids()
      for (const id of old) expect(left).not.toContain(id)
      expect(left).toContain(recent)
      expect(left).toContain(current)
    },
  )
})

/** A detached tmux session running a bash script: a real terminal, with job control when asked. */
class Terminal {
  private readonly socket = `cairn-docs-test-${process.pid}-${Math.random().toString(36).slice(2, 8)}`
  constructor(readonly name: string) {}
  readonly exitFile = () => path.join(work, `${this.name}.exit`)
  private tmux(...args: string[]): string {
    return execFileSync('tmux', ['-L', this.socket, ...args], { encoding: 'utf8' })
  }
  async start(body: string): Promise<void> {
    const script = path.join(work, `${this.name}.sh`)
    const exports = Object.entries({
      ...env,
      NO_COLOR: '1',
      TERM: 'xterm-256color',
      PATH: `${bin}:${process.env.PATH}`,
    })
      .map(([k, v]) => `export ${k}='${v}'`)
      .join('\n')
    await writeFile(script, `${exports}\n${body}\nsleep 30\n`)
    this.tmux('new-session', '-d', '-s', 'cli', '-x', '200', '-y', '50', `bash '${script}'`)
  }
  screen(): string {
    return this.tmux('capture-pane', '-p', '-t', 'cli', '-S', '-200')
  }
  type(text: string): void {
    if (text !== '') this.tmux('send-keys', '-t', 'cli', '-l', text)
    this.tmux('send-keys', '-t', 'cli', 'Enter')
  }
  async until(text: string | RegExp, what: string): Promise<void> {
    const seen = () => (typeof text === 'string' ? this.screen().includes(text) : text.test(this.screen()))
    await waitFor(seen, 30_000, what).catch((error: Error) => {
      throw new Error(`${error.message}; screen:\n${this.screen()}`)
    })
  }
  async exit(): Promise<string> {
    await waitFor(() => existsSync(this.exitFile()), 30_000, `${this.name} to exit`).catch((error: Error) => {
      throw new Error(`${error.message}; screen:\n${this.screen()}`)
    })
    return (await readFile(this.exitFile(), 'utf8')).trim()
  }
  close(): void {
    try {
      this.tmux('kill-server')
    } catch {
      // already gone
    }
  }
}

describe.skipIf(!hasTools)('docs: in a terminal', () => {
  it('`sessions delete` asks, and Enter (the default) deletes nothing', async () => {
    const id = await sessionAt('my-agent', 0, 'keep me')
    const term = new Terminal('delete')
    try {
      await term.start(`cairn sessions delete ${id}\necho $? > '${term.exitFile()}'`)
      await term.until('[y/N]', 'the question, No by default')
      term.type('')
      expect(await term.exit()).toBe('130')
      expect(term.screen()).toContain('Nothing deleted')
      expect((await json(['sessions', 'get', id])).id).toBe(id)
    } finally {
      term.close()
    }
  })

  it('`cairn run analyst "Analyze sales data" &` answers and exits without stopping the job', async () => {
    const term = new Terminal('background')
    try {
      // `set -m`: job control as in an interactive shell, so the job runs in a background process group
      // with the terminal as its stdin.
      await term.start(
        `set -m\ncairn run my-agent "Analyze sales data" &\nwait $!\necho $? > '${term.exitFile()}'`,
      )
      // 150 would be 128 + SIGTTOU: the job stopped for touching the terminal.
      expect(await term.exit()).toBe('0')
      const screen = term.screen()
      expect(screen).toContain('Analyze sales data\n')
      expect(screen).toMatch(/Completed in \d+\.\ds/)
      expect(screen).toMatch(/Resume with: cairn sessions resume ses_[a-z0-9]{8}/)
    } finally {
      term.close()
    }
  })
})
