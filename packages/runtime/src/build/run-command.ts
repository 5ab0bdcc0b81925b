import { StringDecoder } from 'node:string_decoder'
import { newId } from '@cairn/protocol'
import type { SandboxBind, SandboxDriver, SandboxLimits } from '../sandbox/driver.js'

export interface CommandSpec {
  workspaceDir: string
  /** Host directory mounted read-only at /run/cairn. */
  runDir: string
  command: readonly string[]
  env: Readonly<Record<string, string>>
  network: 'none' | 'host'
  binds: readonly SandboxBind[]
  limits: SandboxLimits
  timeoutMs: number
  /** Called with every complete output line (stdout and stderr interleaved as they arrive). */
  onLine: (line: string) => void
}

export interface CommandResult {
  code: number | null
  signal: NodeJS.Signals | null
  limit: 'memory' | 'pids' | undefined
  timedOut: boolean
}

/** Runs one command to completion in a fresh sandbox (build steps, setup commands). */
export async function runSandboxedCommand(driver: SandboxDriver, spec: CommandSpec): Promise<CommandResult> {
  const sandbox = await driver.start({
    id: newId('sandbox'),
    workspaceDir: spec.workspaceDir,
    runDir: spec.runDir,
    command: spec.command,
    env: spec.env,
    limits: spec.limits,
    network: spec.network,
    binds: spec.binds,
  })
  sandbox.stdin.end()
  const pending = { stdout: '', stderr: '' }
  const forward = (stream: 'stdout' | 'stderr') => {
    const decoder = new StringDecoder('utf8')
    sandbox[stream].on('data', (chunk: Buffer) => {
      pending[stream] += decoder.write(chunk).replace(/\r(?!\n)/g, '\n')
      let newline = pending[stream].indexOf('\n')
      while (newline >= 0) {
        spec.onLine(pending[stream].slice(0, newline))
        pending[stream] = pending[stream].slice(newline + 1)
        newline = pending[stream].indexOf('\n')
      }
    })
  }
  forward('stdout')
  forward('stderr')
  let timedOut = false
  const timer = setTimeout(() => {
    timedOut = true
    void sandbox.destroy()
  }, spec.timeoutMs)
  try {
    const exit = await sandbox.exited
    await new Promise((r) => setImmediate(r))
    for (const stream of ['stdout', 'stderr'] as const) if (pending[stream]) spec.onLine(pending[stream])
    return { code: exit.code, signal: exit.signal, limit: exit.limit, timedOut }
  } finally {
    clearTimeout(timer)
    await sandbox.destroy()
  }
}
