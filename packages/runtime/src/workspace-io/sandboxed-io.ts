import { chmod, mkdir, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { CairnProblem, newId } from '@cairn/protocol'
import type { Runtime } from '../runtime.js'

const IO_LIMITS = { memoryMiB: 128, pids: 16, cpus: 1 }

/**
 * Writes and deletes in a workspace happen inside a short-lived sandbox that sees only that
 * workspace, as the sandbox uid: a symlink planted by the agent can never make the host write
 * outside it, and new files get the agent's ownership.
 */
export async function runInWorkspace(
  runtime: Runtime,
  workspaceDir: string,
  command: string[],
  stdin?: Readable,
): Promise<{ code: number | null; stderr: string }> {
  const id = newId('sandbox')
  const runDir = path.join(runtime.runDir, 'sandboxes', `io-${id}`)
  await mkdir(runDir, { recursive: true })
  await chmod(runDir, 0o755)
  await writeFile(path.join(runDir, 'transcript.jsonl'), '')
  const sandbox = await runtime.driver.start({
    id,
    workspaceDir,
    runDir,
    command,
    env: {},
    limits: IO_LIMITS,
  })
  let stderr = ''
  sandbox.stderr.on('data', (chunk: Buffer) => {
    stderr = (stderr + chunk.toString('utf8')).slice(-4000)
  })
  sandbox.stdout.resume()
  try {
    // A command that fails early (disk full, quota) closes its stdin (EPIPE): its exit status
    // and stderr, not EPIPE, say what happened.
    let stdinError: unknown
    if (stdin)
      await pipeline(stdin, sandbox.stdin).catch((error: unknown) => {
        stdinError = error
      })
    else sandbox.stdin.end()
    const exit = await sandbox.exited
    if (stdinError && exit.code === 0) throw stdinError
    return { code: exit.code, stderr }
  } finally {
    await sandbox.destroy()
    await rm(runDir, { recursive: true, force: true })
  }
}

/**
 * Puts `body` at `rel`: written to a staging file beside it, then renamed over it once every byte
 * arrived. A write cut short (its stream broke, the server died mid-write) leaves the file as it
 * was, never truncated or half written; at worst a `.cairn-put-*.tmp` file beside it. The old
 * file's mode is kept; a symlink is written through (its target replaced), as `cat >` did.
 */
export async function writeWorkspaceFile(
  runtime: Runtime,
  workspaceDir: string,
  rel: string,
  body: Readable,
): Promise<void> {
  if (!rel) throw new CairnProblem('validation_failed', 'path must name a file inside /workspace')
  const target = `/workspace/${rel}`
  const staged = `${path.posix.dirname(target)}/.cairn-put-${newId('sandbox')}.tmp`
  const stage = `${CHECK_PLACE} && mkdir -p -- "$(dirname -- "$1")" && cat > "$2" || { rm -f -- "$2"; exit 1; }`
  let written: { code: number | null; stderr: string }
  try {
    written = await runInWorkspace(
      runtime,
      workspaceDir,
      ['sh', '-c', stage, 'cairn-put', target, staged],
      body,
    )
  } catch (error) {
    // The body's stream broke: nothing of it reaches the file.
    await runInWorkspace(runtime, workspaceDir, ['rm', '-f', '--', staged])
    throw error
  }
  if (written.code === 0) {
    const commit =
      't="$(readlink -f -- "$1")" || t="$1"; chmod --reference="$t" -- "$2" 2>/dev/null; mv -fT -- "$2" "$t" || { rm -f -- "$2"; exit 1; }'
    written = await runInWorkspace(runtime, workspaceDir, ['sh', '-c', commit, 'cairn-put', target, staged])
  }
  if (written.code !== 0) {
    const detail = written.stderr.trim() || `exit ${written.code}`
    if (/No space left on device/.test(detail))
      throw new CairnProblem(
        'storage_error',
        `could not write /workspace/${rel}: the storage pool is full (${detail})`,
      )
    if (/Disk quota exceeded/.test(detail))
      throw new CairnProblem(
        'quota_exceeded',
        `could not write /workspace/${rel}: the storage quota is used up (the workspace limit, or the tenant's total of workspaces and snapshots): delete files or snapshots (${detail})`,
      )
    throw (
      placeProblem(rel, detail) ??
      new CairnProblem('forbidden', `could not write /workspace/${rel}: ${detail}`)
    )
  }
}

/**
 * Before a file is written at "$1": it is not a directory, and the nearest of its parents that
 * exists is one. Each refusal is a line of stderr `placeProblem` reads.
 */
const CHECK_PLACE =
  '{ if [ -d "$1" ]; then echo "cairn-put: is a directory" >&2; exit 1; fi; ' +
  'd="$(dirname -- "$1")"; while [ "$d" != / ]; do ' +
  'if [ -e "$d" ] || [ -L "$d" ]; then [ -d "$d" ] && break; ' +
  'printf "cairn-put: not a directory: %s\\n" "$d" >&2; exit 1; fi; d="$(dirname -- "$d")"; done; }'

/** A write refused for where it goes (a directory there, a file above it): 409, with the reason. */
function placeProblem(rel: string, detail: string): CairnProblem | undefined {
  if (/cairn-put: is a directory|cannot overwrite directory|Is a directory/.test(detail))
    return new CairnProblem(
      'conflict',
      `/workspace/${rel} is a directory: a file cannot be written over it (delete it first, or name a file inside it)`,
      { path: rel },
    )
  const above = /cairn-put: not a directory: (.*)/.exec(detail)?.[1]
  if (above !== undefined || /Not a directory/.test(detail))
    return new CairnProblem(
      'conflict',
      `${above ?? 'a parent of the path'} is a file, not a directory: /workspace/${rel} cannot be written under it`,
      { path: rel },
    )
  return undefined
}

export async function deleteWorkspacePath(
  runtime: Runtime,
  workspaceDir: string,
  rel: string,
): Promise<void> {
  if (!rel) throw new CairnProblem('validation_failed', 'refusing to delete the workspace root')
  const result = await runInWorkspace(runtime, workspaceDir, ['rm', '-rf', '--', `/workspace/${rel}`])
  if (result.code !== 0) {
    throw new CairnProblem('forbidden', `could not delete /workspace/${rel}: ${result.stderr.trim()}`)
  }
}

/**
 * After an unpack: no setuid or setgid bit (on anything) and no sticky bit on what is not a
 * directory (where it means nothing) stays in the workspace; a directory keeps its sticky bit.
 */
const STRIP_SPECIAL_BITS =
  'find /workspace -xdev ! -type l ! -type d -perm /7000 -exec chmod ug-s,o-t {} + && ' +
  'find /workspace -xdev -type d -perm /6000 -exec chmod ug-s {} +'

/**
 * Unpacks a tar.gz into a workspace inside a sandbox that sees only that workspace, as the
 * sandbox uid: whatever links the workspace already holds, nothing lands outside it, and every
 * file gets the agent's ownership. Setuid, setgid and meaningless sticky bits are dropped (the
 * permissions are otherwise kept). The archive must have passed `inspectArchive` first.
 */
export async function unpackIntoWorkspace(
  runtime: Runtime,
  workspaceDir: string,
  archive: Buffer,
): Promise<void> {
  const result = await runInWorkspace(
    runtime,
    workspaceDir,
    [
      'sh',
      '-c',
      `tar -xzpf - -C /workspace --no-same-owner --delay-directory-restore && ${STRIP_SPECIAL_BITS}`,
    ],
    Readable.from([archive]),
  )
  if (result.code === 0) return
  const reason = result.stderr.trim() || `exit ${result.code}`
  if (/quota exceeded/i.test(reason))
    throw new CairnProblem(
      'quota_exceeded',
      `the archive does not fit in the storage quota (the workspace limit, or the tenant's total): ${reason}`,
    )
  if (/no space left/i.test(reason))
    throw new CairnProblem('payload_too_large', `the archive does not fit in the workspace: ${reason}`)
  throw new CairnProblem('invalid_archive', `could not unpack the archive: ${reason}`)
}
