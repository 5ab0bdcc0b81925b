import { type ChildProcess, spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import path from 'node:path'
import { expect } from 'vitest'
import { REPO_ROOT } from './server.js'

/** The built `cairn` binary (tests run it as users do; `npm run build` first). */
export const CLI_BIN = path.join(REPO_ROOT, 'packages/cli/bin/cairn.js')

export function assertBuilt(): void {
  if (!existsSync(path.join(REPO_ROOT, 'packages/cli/dist/main.js'))) {
    throw new Error('packages/cli is not built: run `npm run build` before these tests')
  }
}

export interface CliResult {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
}

export interface CliOptions {
  env?: Record<string, string | undefined>
  /** Written to stdin, which is then closed; without it stdin is /dev/null. */
  input?: string
  cwd?: string
  timeoutMs?: number
  /** Runs the binary as this uid (and gid), with no supplementary groups (setpriv). */
  runAs?: number
}

/** Starts the binary; `done` settles when it exits. */
export function spawnCli(
  args: string[],
  baseEnv: Record<string, string | undefined>,
  options: CliOptions = {},
): { child: ChildProcess; done: Promise<CliResult>; output: () => { stdout: string; stderr: string } } {
  const env: Record<string, string> = {}
  for (const [k, v] of Object.entries({ ...process.env, NO_COLOR: '1', ...baseEnv, ...options.env })) {
    if (v !== undefined) env[k] = v
  }
  const uid = options.runAs
  const argv = [process.execPath, CLI_BIN, ...args]
  if (uid !== undefined) argv.unshift('setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups')
  const child = spawn(argv[0] as string, argv.slice(1), {
    env,
    cwd: options.cwd ?? REPO_ROOT,
    stdio: [options.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
  })
  let stdout = ''
  let stderr = ''
  child.stdout?.setEncoding('utf8').on('data', (c: string) => {
    stdout += c
  })
  child.stderr?.setEncoding('utf8').on('data', (c: string) => {
    stderr += c
  })
  if (options.input !== undefined) child.stdin?.end(options.input)
  const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 60_000)
  const done = new Promise<CliResult>((resolve) => {
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout, stderr })
    })
  })
  return { child, done, output: () => ({ stdout, stderr }) }
}

/**
 * A test file's `cairn …` (its result) and `cairn … --json` (asserted to succeed, its output
 * parsed), run with the variables `env()` gives when called (a file sets them in its beforeAll).
 */
export function cliOf(env: () => Record<string, string>) {
  const cairn = (args: string[], options: CliOptions = {}) => spawnCli(args, env(), options).done
  const json = async (args: string[], options: CliOptions = {}) => {
    const r = await cairn([...args, '--json'], options)
    expect(r.stderr).not.toContain('✗')
    expect(r.code).toBe(0)
    return JSON.parse(r.stdout)
  }
  return { cairn, json }
}

export async function waitFor(check: () => boolean, timeoutMs = 20_000, what = 'condition'): Promise<void> {
  const start = Date.now()
  while (!check()) {
    if (Date.now() - start > timeoutMs) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

/** Parses every non-empty stdout line as JSON (for commands that print one record per line). */
export function jsonLines(stdout: string): Record<string, unknown>[] {
  return stdout
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as Record<string, unknown>)
}
