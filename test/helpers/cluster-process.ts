import { type ChildProcess, spawn } from 'node:child_process'
import { createWriteStream, existsSync, readFileSync, type WriteStream } from 'node:fs'
import { mkdir, rmdir, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { readMounts } from '@cairn/runtime'

/** The cgroup v2 hierarchy (pure v2, or the `unified` one of a hybrid host), for `cgroup.kill`. */
export function cgroupV2Root(): string {
  const mount = readMounts().find((m) => m.fsType === 'cgroup2')
  if (!mount) throw new Error('no cgroup2 hierarchy mounted (the cluster harness kills through cgroup.kill)')
  return mount.mountPoint
}

/**
 * A process the cluster harness started, in a cgroup of its own (so everything it forked goes
 * when it is killed), its output appended to `logPath`.
 */
export class ClusterProcess {
  private stdout = ''
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
  private exitState: { code: number | null; signal: NodeJS.Signals | null } | undefined

  private constructor(
    readonly name: string,
    readonly child: ChildProcess,
    readonly cgroupDir: string,
    readonly logPath: string,
    log: WriteStream,
  ) {
    child.stdout?.on('data', (chunk: Buffer) => {
      this.stdout += chunk.toString()
      log.write(chunk)
    })
    child.stderr?.on('data', (chunk: Buffer) => log.write(chunk))
    this.exited = new Promise((resolve) => {
      child.on('exit', (code, signal) => {
        this.exitState = { code, signal }
        log.end()
        resolve({ code, signal })
      })
    })
  }

  /**
   * Starts `argv` in the cgroup `cgroupDir` (created; the process joins it before it execs, so
   * nothing it starts escapes it). `argv` may already be wrapped to enter a network namespace.
   */
  static async start(
    name: string,
    argv: string[],
    options: { cgroupDir: string; logPath: string; env?: NodeJS.ProcessEnv | undefined; cwd?: string },
  ): Promise<ClusterProcess> {
    await mkdir(options.cgroupDir, { recursive: true })
    const log = createWriteStream(options.logPath, { flags: 'a' })
    await new Promise((resolve) => log.once('open', resolve))
    log.write(`\n== ${new Date().toISOString()} ${argv.join(' ')}\n`)
    const child = spawn(
      'sh',
      ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', options.cgroupDir, ...argv],
      { stdio: ['ignore', 'pipe', 'pipe'], env: options.env ?? process.env, cwd: options.cwd },
    )
    return new ClusterProcess(name, child, options.cgroupDir, options.logPath, log)
  }

  get pid(): number {
    return this.child.pid ?? -1
  }

  get running(): boolean {
    return this.exitState === undefined
  }

  /** What it printed on stdout so far. */
  get output(): string {
    return this.stdout
  }

  /** The last `lines` lines of its log (for failure messages). */
  logTail(lines = 40): string {
    try {
      return readFileSync(this.logPath, 'utf8').split('\n').slice(-lines).join('\n')
    } catch {
      return ''
    }
  }

  /** Sends `signal` to the process itself (not its children): `SIGKILL`, `SIGSTOP`, `SIGCONT` … */
  signal(signal: NodeJS.Signals): void {
    if (this.running) process.kill(this.pid, signal)
  }

  /** `kill -9` of the process alone; resolves once it is gone. */
  async kill9(): Promise<void> {
    this.signal('SIGKILL')
    await this.exited
  }

  /** Everything in its cgroup gets SIGKILL (stopped ones too); resolves once the process is gone. */
  async killAll(): Promise<void> {
    const file = path.join(this.cgroupDir, 'cgroup.kill')
    if (existsSync(file)) await writeFile(file, '1').catch(() => undefined)
    else this.signal('SIGKILL')
    await this.exited
    for (let i = 0; i < 100; i++) {
      try {
        await rmdir(this.cgroupDir)
        return
      } catch {
        await new Promise((r) => setTimeout(r, 20))
      }
    }
  }

  /** SIGTERM, then `killAll` if it has not exited within `graceMs`. */
  async stop(graceMs = 10_000): Promise<void> {
    if (this.running) {
      this.signal('SIGCONT')
      this.signal('SIGTERM')
      const timedOut = await Promise.race([
        this.exited.then(() => false),
        new Promise<boolean>((r) => setTimeout(() => r(true), graceMs).unref()),
      ])
      if (!timedOut) return this.killAll()
    }
    await this.killAll()
  }

  /** Resolves with the first stdout line matching `pattern`; rejects if the process exits first. */
  async waitForLine(pattern: RegExp, timeoutMs = 60_000): Promise<string> {
    const deadline = Date.now() + timeoutMs
    while (Date.now() < deadline) {
      const line = this.stdout.split('\n').find((l) => pattern.test(l))
      if (line !== undefined) return line
      if (!this.running)
        throw new Error(`${this.name} exited (${JSON.stringify(this.exitState)}):\n${this.logTail()}`)
      await new Promise((r) => setTimeout(r, 50))
    }
    throw new Error(`${this.name}: no line matching ${pattern} in ${timeoutMs} ms:\n${this.logTail()}`)
  }
}

/** Thrown by a `waitFor` check to stop waiting at once (other errors are retried). */
export class StopWaiting extends Error {}

/** Polls `check` every `intervalMs` until it returns a value other than undefined/false. */
export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs = 30_000,
  intervalMs = 100,
): Promise<T> {
  const deadline = Date.now() + timeoutMs
  let last: unknown
  while (Date.now() < deadline) {
    try {
      const value = await check()
      if (value !== undefined && value !== false) return value
    } catch (error) {
      if (error instanceof StopWaiting) throw error
      last = error
    }
    await new Promise((r) => setTimeout(r, intervalMs))
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}`)
}
