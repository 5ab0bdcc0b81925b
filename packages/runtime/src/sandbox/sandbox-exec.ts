import { type ChildProcess, spawn } from 'node:child_process'
import { readFile } from 'node:fs/promises'
import os from 'node:os'
import type { Readable, Writable } from 'node:stream'
import { fileURLToPath } from 'node:url'
import { CairnProblem, COMMAND_SIGNALS } from '@cairn/protocol'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'
import type { SandboxExecProcess, SandboxExecSpec } from './driver.js'
import { LAUNCHER_SHELL, launcherArgs } from './launcher.js'
import { SANDBOX_USER } from './rootfs.js'

const HELPER = fileURLToPath(new URL('../../helpers/sandbox_exec.py', import.meta.url))
/** How long after the command's exit its output pipes may take to drain (a child it left holds them). */
const EXIT_DRAIN_MS = 1000

/** Where a command enters a running bwrap sandbox: its cgroups, its first process, its seccomp program. */
export interface ExecTarget {
  /** The sandbox's outer (host) process: its first child holds the sandbox's namespaces. */
  outerPid: number
  /** The `cgroup.procs` files the command joins (the sandbox's cgroups). */
  procsFiles: readonly string[]
  /** The seccomp program's file (undefined: none is loaded, as for the sandbox itself). */
  seccompFile: string | undefined
}

/** How long a sandbox just started may take to reach its command (its namespaces all made). */
const SETTLE_MS = 5000
const SETTLE_POLL_MS = 10

async function firstChild(pid: number): Promise<number | undefined> {
  const children = await readFile(`/proc/${pid}/task/${pid}/children`, 'utf8').catch(() => '')
  const first = children.trim().split(/\s+/).filter(Boolean)[0]
  return first === undefined ? undefined : Number(first)
}

/**
 * The host pid of the sandbox's command (the agent), whose namespaces are the sandbox's as they
 * end up: the outer bwrap's child is the sandbox's init, which forks the command once every
 * namespace is made (a user namespace's id maps written, bwrap's nested one for --disable-userns).
 * A sandbox just started is waited for, `SETTLE_MS` at most; undefined when it has no command.
 */
async function sandboxCommand(outerPid: number): Promise<number | undefined> {
  const deadline = Date.now() + SETTLE_MS
  while (true) {
    const init = await firstChild(outerPid)
    const command = init === undefined ? undefined : await firstChild(init)
    if (command !== undefined || Date.now() > deadline) return command
    await new Promise((resolve) => setTimeout(resolve, SETTLE_POLL_MS))
  }
}

/**
 * Runs a command inside a running bwrap sandbox (helpers/sandbox_exec.py): in the sandbox's
 * cgroups, namespaces, user and seccomp filter, as the agent runs, with the environment on a pipe.
 */
export async function execInSandbox(target: ExecTarget, spec: SandboxExecSpec): Promise<SandboxExecProcess> {
  const init = await sandboxCommand(target.outerPid)
  if (init === undefined)
    throw new CairnProblem('sandbox_not_running', 'the sandbox has no running process to join')
  const helper = [
    'python3',
    '-I',
    '-S',
    HELPER,
    String(init),
    target.seccompFile ?? '-',
    String(SANDBOX_USER.uid),
    String(SANDBOX_USER.gid),
    spec.cwd ?? '/workspace',
    ...(spec.pty ? ['--pty', String(spec.pty.rows), String(spec.pty.cols)] : []),
    '--',
    ...spec.command,
  ]
  const child = spawn(LAUNCHER_SHELL, launcherArgs(5, target.procsFiles, helper), {
    stdio: ['pipe', 'pipe', 'pipe', 'pipe', 'pipe', 'pipe'],
    env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
    ...OWN_PROCESS_GROUP,
  })
  const envPipe = child.stdio[3] as Writable
  const control = child.stdio[4] as Writable
  for (const stream of [child.stdin, envPipe, control]) stream?.on('error', () => undefined)
  child.on('error', () => undefined)
  envPipe.end(
    Object.entries(spec.env)
      .map(([name, value]) => `${name}=${value}\0`)
      .join(''),
  )
  const running = new ExecProcess(child, control)
  const statusPipe = (child.stdio as unknown as Readable[])[5] as Readable
  const status = await firstLine(statusPipe, STARTED_MS)
  if (status === 'OK') return running
  running.signal('SIGKILL')
  child.kill('SIGKILL')
  const [, kind, ...reason] = (status ?? 'ERR sandbox the command did not start in time').split(' ')
  throw kind === 'exec'
    ? new CairnProblem('bad_request', `the command could not be run: ${reason.join(' ')}`)
    : new CairnProblem('sandbox_not_running', `the command could not enter the sandbox: ${reason.join(' ')}`)
}

/** How long the helper may take to run the command (a python start, the namespaces, the exec). */
const STARTED_MS = 10_000

/** The first line of the helper's status pipe (undefined: it closed or timed out first). */
function firstLine(stream: Readable, timeoutMs: number): Promise<string | undefined> {
  return new Promise((resolve) => {
    let text = ''
    const done = (line: string | undefined) => {
      clearTimeout(timer)
      stream.off('data', onData)
      stream.off('end', onEnd)
      stream.resume()
      resolve(line)
    }
    const onData = (chunk: Buffer) => {
      text += chunk.toString()
      const end = text.indexOf('\n')
      if (end >= 0) done(text.slice(0, end))
      else if (text.length > 4096) done(text.slice(0, 4096))
    }
    const onEnd = () => done(undefined)
    const timer = setTimeout(() => done(undefined), timeoutMs)
    stream.on('data', onData)
    stream.once('end', onEnd)
    stream.on('error', () => undefined)
  })
}

class ExecProcess implements SandboxExecProcess {
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>

  constructor(
    private readonly child: ChildProcess,
    private readonly control: Writable,
  ) {
    this.exited = new Promise((resolve) => {
      let settled = false
      const settle = (code: number | null, signal: NodeJS.Signals | null) => {
        if (settled) return
        settled = true
        this.control.end()
        resolve({ code, signal })
      }
      child.once('close', settle)
      child.once('exit', (code, signal) => setTimeout(() => settle(code, signal), EXIT_DRAIN_MS).unref())
    })
  }

  get stdin(): Writable {
    return this.child.stdin as Writable
  }
  get stdout(): Readable {
    return this.child.stdout as Readable
  }
  get stderr(): Readable {
    return this.child.stderr as Readable
  }

  signal(name: NodeJS.Signals): void {
    const number = (COMMAND_SIGNALS as readonly string[]).includes(name)
      ? os.constants.signals[name]
      : undefined
    if (number === undefined)
      throw new CairnProblem('bad_request', `signal ${name} cannot be sent to a command`)
    if (this.child.exitCode !== null || this.child.signalCode !== null) return
    this.control.write(`SIG ${number}\n`)
  }

  resize(rows: number, cols: number): void {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return
    this.control.write(`WINSIZE ${Math.trunc(rows)} ${Math.trunc(cols)}\n`)
  }
}
