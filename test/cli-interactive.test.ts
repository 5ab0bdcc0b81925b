import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, CLI_BIN, jsonLines, spawnCli, waitFor } from './helpers/cli.js'
import { makeProject } from './helpers/projects.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

/** An agent that blocks on "slow" so that a turn can be interrupted while it runs. */
const SLOW_AGENT = `while IFS= read -r line; do
  if [ "$line" = slow ]; then echo "starting"; sleep 30; fi
  echo "got: $line"
done
`

let t: TestServer
let work: string
let env: Record<string, string>

beforeAll(async () => {
  assertBuilt()
  t = await startTestServer()
  work = await mkdtemp(path.join(os.tmpdir(), 'cairn-cli-tty-'))
  env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: work }
  const slow = await makeProject({ 'slow.sh': SLOW_AGENT })
  for (const dir of [`${EXAMPLES}/echo`, slow]) {
    const r = await spawnCli(['deploy', dir, '--name', dir === slow ? 'slow' : 'echo', '--yes'], env).done
    // Its steps are on stderr (Packing…, Uploading…); no error.
    expect(r.stderr).not.toContain('✗')
    expect(r.code).toBe(0)
  }
  await rm(slow, { recursive: true, force: true })
})

afterAll(async () => {
  await t?.close()
  if (work) await rm(work, { recursive: true, force: true })
})

describe('cancelling a turn', () => {
  it('Ctrl-C (SIGINT) cancels the running turn, exits 130 and leaves the session usable', async () => {
    const run = spawnCli(['run', 'slow', 'slow', '--single'], env)
    await waitFor(() => run.output().stdout.includes('starting'), 30_000, 'the turn to start')
    run.child.kill('SIGINT')
    const result = await run.done
    expect(result.code).toBe(130)
    expect(result.stderr).toContain('Cancelled')
    const id = /Session (ses_[a-z0-9]+)/.exec(result.stderr)?.[1]
    expect(id).toBeDefined()
    const after = await spawnCli(['run', 'slow', '--session', String(id), 'fast', '--single', '--json'], env)
      .done
    expect(after.code).toBe(0)
    expect(jsonLines(after.stdout)[0]).toMatchObject({
      sessionId: id,
      finishReason: 'completed',
      text: 'got: fast\n',
    })
    const messages = JSON.parse(
      (await spawnCli(['sessions', 'messages', String(id), '--json'], env).done).stdout,
    )
    expect(
      messages.filter((m: { role: string }) => m.role === 'user').map((m: { content: string }) => m.content),
    ).toEqual(['slow', 'fast'])
  })
})

const hasTmux = (() => {
  try {
    execFileSync('tmux', ['-V'])
    return true
  } catch {
    return false
  }
})()

/** Runs the CLI in a real pseudo-terminal (a detached tmux session) and types into it. */
class Terminal {
  private readonly socket = `cairn-cli-test-${process.pid}-${Math.random().toString(36).slice(2, 8)}`
  readonly exitFile: string

  constructor(
    private readonly dir: string,
    readonly name: string,
  ) {
    this.exitFile = path.join(dir, `${name}.exit`)
  }

  private tmux(...args: string[]): string {
    return execFileSync('tmux', ['-L', this.socket, ...args], { encoding: 'utf8' })
  }

  async start(args: string[]): Promise<void> {
    const script = path.join(this.dir, `${this.name}.sh`)
    const exports = Object.entries({ ...env, NO_COLOR: '1', TERM: 'xterm-256color' })
      .map(([k, v]) => `export ${k}='${v}'`)
      .join('\n')
    const quoted = args.map((a) => `'${a}'`).join(' ')
    await writeFile(
      script,
      `${exports}\n'${process.execPath}' '${CLI_BIN}' ${quoted}\necho $? > '${this.exitFile}'\nsleep 30\n`,
    )
    await chmod(script, 0o755)
    this.tmux('new-session', '-d', '-s', 'cli', '-x', '200', '-y', '50', `bash '${script}'`)
  }

  screen(): string {
    return this.tmux('capture-pane', '-p', '-t', 'cli', '-S', '-200')
  }

  type(text: string): void {
    this.tmux('send-keys', '-t', 'cli', '-l', text)
    this.tmux('send-keys', '-t', 'cli', 'Enter')
  }

  key(name: string): void {
    this.tmux('send-keys', '-t', 'cli', name)
  }

  /** Waits for the screen to show `text` (tmux trims trailing spaces, so `You> ` reads `You>`). */
  async until(text: string | RegExp, what: string): Promise<void> {
    const seen = () => (typeof text === 'string' ? this.screen().includes(text) : text.test(this.screen()))
    await waitFor(seen, 30_000, `${what}; screen:\n${this.screen()}`).catch((error: Error) => {
      throw new Error(`${error.message}\n${this.screen()}`)
    })
  }

  async exitCode(): Promise<number> {
    await waitFor(() => existsSync(this.exitFile), 30_000, 'the CLI to exit')
    return Number((await readFile(this.exitFile, 'utf8')).trim())
  }

  close(): void {
    try {
      this.tmux('kill-server')
    } catch {
      // already gone
    }
  }
}

describe.skipIf(!hasTmux)('cairn run in a real terminal', () => {
  it('runs a You>/Agent> loop, two messages then exit, and prints how to resume', async () => {
    const term = new Terminal(work, 'loop')
    try {
      await term.start(['run', 'echo'])
      await term.until(/^You>/m, 'the first prompt')
      term.type('hello from a tty')
      await term.until('Agent> hello from a tty', 'the first reply')
      await term.until(/Agent> hello from a tty\n(.*\n)*You>/, 'the second prompt')
      term.type('second message')
      await term.until('Agent> second message', 'the second reply')
      term.type('exit')
      expect(await term.exitCode()).toBe(0)
      const screen = term.screen()
      expect(screen).toMatch(/Resume with: cairn sessions resume ses_[a-z0-9]{8}/)
      expect(screen).toMatch(/Completed in \d/)
      const id = /resume (ses_[a-z0-9]{8})/.exec(screen)?.[1]
      const info = JSON.parse((await spawnCli(['sessions', 'get', String(id), '--json'], env).done).stdout)
      expect(info).toMatchObject({ status: 'idle', turnCount: 2 })
    } finally {
      term.close()
    }
  })

  it('Ctrl-C during a turn cancels it and exits 130', async () => {
    const term = new Terminal(work, 'cancel')
    try {
      await term.start(['run', 'slow'])
      await term.until(/^You>/m, 'the prompt')
      term.type('slow')
      await term.until('starting', 'the slow turn')
      term.key('C-c')
      expect(await term.exitCode()).toBe(130)
      expect(term.screen()).toContain('Cancelled')
    } finally {
      term.close()
    }
  })

  it('Ctrl-D at the prompt leaves without ending the session', async () => {
    const term = new Terminal(work, 'eof')
    try {
      await term.start(['run', 'echo', 'first words'])
      await term.until('Agent> first words', 'the reply to the prompt argument')
      await term.until(/^You>$/m, 'the prompt')
      term.key('C-d')
      expect(await term.exitCode()).toBe(0)
      expect(term.screen()).toContain('Resume with: cairn sessions resume')
    } finally {
      term.close()
    }
  })
})
