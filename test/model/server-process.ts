import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { createWriteStream, openSync, readdirSync, readFileSync } from 'node:fs'
import { mkdir, readFile } from 'node:fs/promises'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { instanceRunDir } from '@cairn/runtime'
import { testDatabaseFor } from '../fixtures/test-database.mjs'
import { assertBuilt, CLI_BIN } from '../helpers/cli.js'

/** Every server process started, by work dir (so a test's end can stop any still running). */
const started = new Map<string, ChildProcess[]>()

/** How the process ended: its exit code, or the signal that ended it. */
export interface Exit {
  code: number | null
  signal: NodeJS.Signals | null
}

/**
 * `cairn server` (the real command, as an operator runs it) on `<workDir>/data`, in a process
 * group of its own, so the model test can kill -9 it, signal its group as a terminal or systemd
 * does, and start it again on the same data dir. Its stderr goes to `<workDir>/server.log`.
 */
export class ServerProcess {
  private constructor(
    readonly workDir: string,
    readonly child: ChildProcess,
    readonly url: string,
    readonly key: string,
    readonly exited: Promise<Exit>,
  ) {}

  static dataDirOf(workDir: string): string {
    return path.join(workDir, 'data')
  }

  static async start(workDir: string): Promise<ServerProcess> {
    assertBuilt()
    const dataDir = ServerProcess.dataDirOf(workDir)
    const home = path.join(workDir, 'home')
    await mkdir(dataDir, { recursive: true })
    await mkdir(home, { recursive: true })
    const database = await testDatabaseFor(dataDir)
    const args = [
      CLI_BIN,
      'server',
      '--data-dir',
      dataDir,
      '--port',
      '0',
      '--json',
      '--log-level',
      process.env.CAIRN_MODEL_LOG_LEVEL ?? 'info',
    ]
    if (database) args.push('--database', database)
    const log = openSync(path.join(workDir, 'server.log'), 'a')
    const child = spawn(process.execPath, args, {
      detached: true,
      stdio: ['ignore', 'pipe', log],
      env: { ...process.env, HOME: home, XDG_CONFIG_HOME: path.join(home, '.config'), NO_COLOR: '1' },
    })
    started.set(workDir, [...(started.get(workDir) ?? []), child])
    const exited = new Promise<Exit>((resolve) =>
      child.once('exit', (code, signal) => resolve({ code, signal })),
    )
    const out = createWriteStream('', { fd: log, autoClose: false })
    const line = await Promise.race([
      new Promise<string>((resolve) =>
        createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', (l) => {
          // The --json record names the URL and the admin key; the rest is the server's log.
          if (isRecord(l)) resolve(l)
          else out.write(`${l}\n`)
        }),
      ),
      exited.then((exit) => {
        throw new Error(`cairn server exited before listening (${JSON.stringify(exit)}):\n${tail(workDir)}`)
      }),
    ])
    const info = JSON.parse(line) as { url: string; adminKeyPath: string }
    const key = (await readFile(info.adminKeyPath, 'utf8')).trim()
    return new ServerProcess(workDir, child, info.url, key, exited)
  }

  /** Every server started on `workDir` and still running gets SIGTERM (then SIGKILL past `boundMs`). */
  static async stopAll(workDir: string, boundMs: number): Promise<void> {
    for (const child of started.get(workDir) ?? []) {
      if (child.exitCode !== null || child.signalCode !== null) continue
      const gone = new Promise((resolve) => child.once('exit', resolve))
      child.kill('SIGTERM')
      const timer = setTimeout(() => child.kill('SIGKILL'), boundMs)
      await gone
      clearTimeout(timer)
    }
    started.delete(workDir)
  }

  /** The process tree when a stop last timed out. */
  lastTree = ''

  get pid(): number {
    return this.child.pid ?? -1
  }

  get dataDir(): string {
    return ServerProcess.dataDirOf(this.workDir)
  }

  /** The instance's run dir (`/run/cairn/<hash>`), where its pool and sandboxes are mounted. */
  get runDir(): string {
    return instanceRunDir(this.dataDir)
  }

  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null
  }

  /** kill -9 of the server process alone (its sandboxes live on, as after a crash). */
  async kill9(): Promise<void> {
    if (this.running) process.kill(this.pid, 'SIGKILL')
    await this.exited
  }

  /**
   * `signal` to the server's whole process group (what Ctrl-C in a terminal and systemd's
   * KillMode=control-group send). Resolves with how it ended, or undefined if it was still
   * running `boundMs` later (then it is killed, so nothing is left running).
   */
  async signalGroup(signal: NodeJS.Signals, boundMs: number): Promise<Exit | undefined> {
    if (this.running) process.kill(-this.pid, signal)
    return this.waitExit(boundMs)
  }

  /** SIGTERM to the server process alone, the graceful stop. */
  async stop(boundMs: number): Promise<Exit | undefined> {
    if (this.running) process.kill(this.pid, 'SIGTERM')
    return this.waitExit(boundMs)
  }

  /** The server's process tree with states (for a report of a stop that did not end). */
  processTree(): string {
    const ps =
      spawnSync('ps', ['-e', '-o', 'pid,ppid,pgid,stat,wchan:24,args'], { encoding: 'utf8' }).stdout ?? ''
    const rows = ps
      .split('\n')
      .slice(1)
      .map((line) => line.trim().split(/\s+/))
    const tree = new Set([this.pid])
    for (let grew = true; grew; ) {
      grew = false
      for (const row of rows) {
        if (tree.has(Number(row[1])) && !tree.has(Number(row[0]))) {
          tree.add(Number(row[0]))
          grew = true
        }
      }
    }
    const procs = rows
      .filter((row) => tree.has(Number(row[0])) || Number(row[2]) === this.pid)
      .map((row) => row.join(' ').slice(0, 160))
    const lines = (spawnSync('ss', ['-tanpiO'], { encoding: 'utf8' }).stdout ?? '').split('\n')
    const own = lines.filter((line) => line.includes(`pid=${this.pid},`))
    const ports = own.flatMap((line) => (line.split(/\s+/)[3] ?? '').split(':').slice(-1))
    const sockets = lines.filter((line) => ports.some((port) => line.includes(`:${port} `)))
    return [...procs, 'its TCP sockets:', ...sockets].join('\n')
  }

  private async waitExit(boundMs: number): Promise<Exit | undefined> {
    let timer: NodeJS.Timeout | undefined
    const exit = await Promise.race([
      this.exited,
      new Promise<undefined>((resolve) => {
        timer = setTimeout(() => resolve(undefined), boundMs)
      }),
    ])
    clearTimeout(timer)
    if (exit === undefined) {
      this.lastTree = this.processTree()
      await this.kill9()
    }
    return exit
  }

  logTail(lines = 30): string {
    return tail(this.workDir, lines)
  }
}

function isRecord(line: string): boolean {
  try {
    const parsed = JSON.parse(line) as { url?: unknown; adminKeyPath?: unknown; level?: unknown }
    return (
      typeof parsed.url === 'string' && typeof parsed.adminKeyPath === 'string' && parsed.level === undefined
    )
  } catch {
    return false
  }
}

function tail(workDir: string, lines = 30): string {
  try {
    return readFileSync(path.join(workDir, 'server.log'), 'utf8').split('\n').slice(-lines).join('\n')
  } catch {
    return ''
  }
}

/** Mount points at or under `dir` (from /proc/self/mountinfo). */
export function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => (line.split(' ')[4] ?? '').replace(/\\040/g, ' '))
    .filter((point) => point === dir || point.startsWith(`${dir}/`))
}

/**
 * The host pid of the agent whose turn runs `sleep <marker>`: the `bash agent.sh` process above
 * that sleep (found through /proc, as an operator would with ps).
 */
export function agentPidRunning(marker: string): number | undefined {
  const procs = new Map<number, { ppid: number; argv: string[] }>()
  for (const entry of readdirSafe('/proc')) {
    const pid = Number(entry)
    if (!Number.isInteger(pid)) continue
    try {
      const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean)
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      procs.set(pid, { ppid, argv })
    } catch {
      // gone meanwhile
    }
  }
  for (const [pid, proc] of procs) {
    if (proc.argv[0] !== 'sleep' || proc.argv[1] !== marker) continue
    let at = procs.get(pid)?.ppid
    for (let depth = 0; at !== undefined && depth < 6; depth++) {
      const up = procs.get(at)
      if (!up) break
      if (up.argv[0] === 'bash' && up.argv[1] === 'agent.sh') return at
      at = up.ppid
    }
  }
  return undefined
}

function readdirSafe(dir: string): string[] {
  try {
    return readdirSync(dir)
  } catch {
    return []
  }
}
