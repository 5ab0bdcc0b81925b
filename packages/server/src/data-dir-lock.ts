import { type ChildProcess, spawn } from 'node:child_process'
import { readFile, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { CairnProblem } from '@cairn/protocol'

/** In the data dir, and in a storage pool given by path (`--pool-path`), which may be shared by mistake. */
export const LOCK_FILE = 'cairn.lock'
/** flock(1)'s exit code when the lock is held elsewhere (`--conflict-exit-code`). */
const HELD_ELSEWHERE = 75
/** How long a start waits for a dead holder's lock to go (its helper sees EOF and exits). */
const DEAD_HOLDER_GRACE_MS = 3000

/**
 * The exclusive claim of one server on its data dir: an flock(2) on `<dataDir>/cairn.lock`, which
 * holds the holder's pid. Node has no flock, so a helper (`flock` from util-linux) takes it and
 * keeps it while it reads its stdin, a pipe from this process: when the server exits in any way,
 * SIGKILL included, the pipe closes, the helper ends and the kernel drops the lock. The helper
 * runs in its own process group, so the terminal's Ctrl-C does not take the lock away while the
 * server is still draining. The lock is on the file, not the path: a symlinked or bind-mounted
 * path to the same dir finds it taken.
 */
export class DataDirLock {
  private released = false

  private constructor(
    readonly lockPath: string,
    private readonly helper: ChildProcess,
  ) {}

  /**
   * Takes the lock or refuses with `conflict`, naming the holder's pid. Touches nothing else.
   * `what` names the directory in the refusal ("data dir", "storage pool") and `option` the way
   * to give this server its own.
   */
  static async acquire(
    dir: string,
    options: { what?: string; option?: string; onLost?: () => void } = {},
  ): Promise<DataDirLock> {
    const { what = 'data dir', option = '--data-dir', onLost } = options
    const lockPath = path.join(dir, LOCK_FILE)
    const started = Date.now()
    for (;;) {
      const attempt = await tryLock(lockPath)
      if (attempt.helper) {
        await writeFile(lockPath, `${process.pid}\n`)
        const lock = new DataDirLock(lockPath, attempt.helper)
        attempt.helper.once('exit', () => {
          if (!lock.released) onLost?.()
        })
        return lock
      }
      const holder = await readHolder(lockPath)
      // A holder that is gone still holds the lock for the moment its helper takes to see EOF.
      if (holder !== undefined && !isAlive(holder) && Date.now() - started < DEAD_HOLDER_GRACE_MS) {
        await new Promise((resolve) => setTimeout(resolve, 100))
        continue
      }
      throw new CairnProblem(
        'conflict',
        `${what} ${dir} is in use by another Cairn server (pid ${holder ?? 'unknown'}, lock ${lockPath}); stop that server first, or give this one its own ${option}`,
        { lockPath, ...(holder === undefined ? {} : { holderPid: holder }) },
      )
    }
  }

  /** Drops the lock (the helper ends when its stdin closes). */
  async release(): Promise<void> {
    if (this.released) return
    this.released = true
    const exited = new Promise((resolve) => {
      if (this.helper.exitCode !== null || this.helper.signalCode !== null) resolve(undefined)
      else this.helper.once('exit', resolve)
    })
    // Held by the event loop again while it goes, so that a process with nothing else to do
    // waits for the lock to be dropped rather than ending with the wait unsettled.
    this.helper.ref()
    this.helper.stdin?.end()
    await exited
  }
}

async function tryLock(lockPath: string): Promise<{ helper?: ChildProcess }> {
  const helper = spawn(
    'flock',
    [
      '--exclusive',
      '--nonblock',
      '--conflict-exit-code',
      String(HELD_ELSEWHERE),
      lockPath,
      'sh',
      '-c',
      'echo locked && exec cat >/dev/null',
    ],
    { stdio: ['pipe', 'pipe', 'pipe'], detached: true },
  )
  let stderr = ''
  helper.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
    stderr += chunk
  })
  const outcome = await new Promise<'locked' | { code: number | null; error?: Error }>((resolve) => {
    createInterface({ input: helper.stdout as NodeJS.ReadableStream }).once('line', () => resolve('locked'))
    helper.once('error', (error) => resolve({ code: null, error }))
    helper.once('exit', (code) => resolve({ code }))
  })
  if (outcome === 'locked') {
    // Only stdin stays open: the helper must not keep this process alive, nor hold its output.
    helper.stdout?.destroy()
    helper.stderr?.destroy()
    helper.unref()
    ;(helper.stdin as unknown as { unref?: () => void } | null)?.unref?.()
    return { helper }
  }
  if (outcome.code === HELD_ELSEWHERE) return {}
  const why =
    (outcome.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT'
      ? 'flock (util-linux) is not installed'
      : (outcome.error?.message ?? (stderr.trim() || `flock exited with ${outcome.code}`))
  throw new CairnProblem('unavailable', `cannot lock the data dir (${lockPath}): ${why}`)
}

async function readHolder(lockPath: string): Promise<number | undefined> {
  const text = await readFile(lockPath, 'utf8').catch(() => '')
  const pid = Number(text.trim())
  return Number.isInteger(pid) && pid > 0 ? pid : undefined
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
}
