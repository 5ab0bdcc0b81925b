import { mkdir, readdir, readFile, stat } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { Sandbox } from '../sandbox/driver.js'
import { GvisorSandbox } from '../sandbox/gvisor-sandbox.js'
import { type RunscConfig, runsc, runscFlags } from '../sandbox/runsc.js'

/** The runsc arguments that restore a sandbox from `imageDir` in place of `run` (see GvisorDriver). */
export function restoreArgs(imageDir: string): string[] {
  return ['restore', '--image-path', imageDir]
}

/**
 * The agent's command behind a stdin relay, for a sandbox that may be checkpointed. A process that
 * waits for its stdin with epoll (Node's libuv; `read(2)` callers such as Python, bash or `cat` are
 * not affected) is never woken again after `runsc restore` when that stdin is the host pipe: the
 * restored sandbox's stdin is the restoring runsc's new pipe, and the agent's epoll no longer hears
 * of it (runsc 20221219, ptrace; a line written after the restore stays unread). Behind the relay
 * the agent reads a FIFO inside the sandbox (gVisor's own pipe, saved and restored whole), and only
 * `cat`, which blocks in `read(2)`, reads the host pipe. The agent is still the sandbox's init
 * (`exec`): its exit ends the sandbox; the FIFO's name is gone once both ends are open.
 */
export function stdinRelayCommand(command: readonly string[]): string[] {
  const script = [
    'f=$(mktemp -u /tmp/.cairn-stdin.XXXXXX) && mkfifo -m 600 "$f" || { echo "cairn: the stdin relay of a pause: memory sandbox needs sh, mktemp, mkfifo and cat" >&2; exit 127; }',
    // A background job's stdin would be /dev/null: the host pipe goes to it as fd 4.
    'exec 4<&0',
    '{ exec 3>"$f" && rm -f "$f" && exec cat <&4 >&3 4<&-; } &',
    'exec "$@" <"$f" 4<&-',
  ].join('\n')
  return ['/bin/sh', '-c', script, 'cairn-stdin-relay', ...command]
}

/** How long a `runsc checkpoint` may take: it writes the sandbox's whole memory (up to its limit). */
const CHECKPOINT_TIMEOUT_MS = 120_000

/**
 * Writes a running gVisor sandbox's state (every task, its memory, open files and sockets, the
 * network stack) to `imageDir/checkpoint.img` with `runsc checkpoint`. The sandbox's processes end
 * with it: the caller destroys the sandbox afterwards, and `runsc restore` brings it back.
 */
export async function checkpointGvisor(
  sandbox: Sandbox,
  config: RunscConfig,
  imageDir: string,
): Promise<{ bytes: number }> {
  if (!(sandbox instanceof GvisorSandbox)) {
    throw new CairnProblem('bad_request', 'this sandbox is not a gVisor sandbox', { driver: sandbox.driver })
  }
  await mkdir(imageDir, { recursive: true, mode: 0o700 })
  await runsc(
    config,
    [...runscFlags(config), 'checkpoint', '--image-path', imageDir, sandbox.id],
    CHECKPOINT_TIMEOUT_MS,
  )
  return { bytes: await directoryBytes(imageDir) }
}

/** Bytes of the files directly in `dir` (a checkpoint's image and manifest). */
export async function directoryBytes(dir: string): Promise<number> {
  let total = 0
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    if (entry.isFile()) total += (await stat(path.join(dir, entry.name))).size
  }
  return total
}

/** After this long without a readable state file, `containerStatus` asks `runsc state` too. */
const STATE_FILE_GRACE_MS = 1000

/**
 * The container's status as runsc records it in its state file under `--root` (what `runsc state`
 * prints, read without starting a runsc process: one costs 10–40 ms of CPU beside the restore it
 * waits for; releases 20221219 and 20240729 keep it there). Where that file is not readable (not
 * written yet, written half, or another release's layout), `askRunsc` has `runsc state` answer.
 */
export async function containerStatus(
  config: RunscConfig,
  id: string,
  askRunsc: boolean,
): Promise<string | undefined> {
  try {
    const state = JSON.parse(await readFile(path.join(config.root, `${id}_sandbox:${id}.state`), 'utf8'))
    if (typeof state?.status === 'string') return state.status
  } catch {
    // Not readable yet: runsc writes it when the sandbox is created and each time its status changes.
  }
  if (!askRunsc) return undefined
  const printed = await runsc(config, ['state', id]).catch(() => '')
  return /"status":\s*"running"/.test(printed) ? 'running' : undefined
}

/** How long a `runsc restore` may take to load an image and run the sandbox again. */
const RESTORE_TIMEOUT_MS = 120_000

/**
 * Resolves once `runsc restore` has the sandbox running again (`runsc state` says so); rejects with
 * runsc's own words when it exits first (an image it cannot load, mounts that do not match).
 */
export async function restored(sandbox: Sandbox, config: RunscConfig): Promise<void> {
  let stderr = ''
  const collect = (chunk: Buffer) => {
    stderr = `${stderr}${chunk.toString('utf8')}`.slice(-4000)
  }
  sandbox.stderr.on('data', collect)
  let exited = false
  const exit = sandbox.exited.then((e) => {
    exited = true
    return e
  })
  try {
    const started = Date.now()
    const deadline = started + RESTORE_TIMEOUT_MS
    while (Date.now() < deadline) {
      const status = await containerStatus(config, sandbox.id, Date.now() - started > STATE_FILE_GRACE_MS)
      if (status === 'running') return
      if (exited) break
      await Promise.race([exit, new Promise((r) => setTimeout(r, 5))])
    }
    const end = exited ? await exit : undefined
    const last = stderr.trim().split('\n').slice(-3).join(' | ')
    throw new CairnProblem(
      'sandbox_failed',
      end
        ? `runsc restore exited (code ${end.code ?? end.signal}): ${last || 'no output'}`
        : `runsc restore did not run the sandbox within ${RESTORE_TIMEOUT_MS / 1000} s`,
      { driver: 'gvisor' },
    )
  } finally {
    sandbox.stderr.off('data', collect)
  }
}
