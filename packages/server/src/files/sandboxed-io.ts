import { chmod, mkdir, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import type { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { CairnProblem, newId } from '@cairn/protocol'
import type { Runtime } from '@cairn/runtime'

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
    if (stdin) {
      // A command that stops reading (its write failed: disk full, quota) closes the pipe; its
      // exit code and stderr, not EPIPE, say what happened.
      await pipeline(stdin, sandbox.stdin).catch((error: NodeJS.ErrnoException) => {
        if (error.code !== 'EPIPE') throw error
      })
    } else sandbox.stdin.end()
    const exit = await sandbox.exited
    return { code: exit.code, stderr }
  } finally {
    await sandbox.destroy()
    await rm(runDir, { recursive: true, force: true })
  }
}

export async function writeWorkspaceFile(
  runtime: Runtime,
  workspaceDir: string,
  rel: string,
  body: Readable,
): Promise<void> {
  if (!rel) throw new CairnProblem('validation_failed', 'path must name a file inside /workspace')
  const result = await runInWorkspace(
    runtime,
    workspaceDir,
    ['sh', '-c', 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', 'cairn-put', `/workspace/${rel}`],
    body,
  )
  if (result.code !== 0) {
    const detail = result.stderr.trim() || `exit ${result.code}`
    if (/No space left on device/.test(detail))
      throw new CairnProblem(
        'storage_error',
        `could not write /workspace/${rel}: the storage pool is full (${detail})`,
      )
    if (/Disk quota exceeded/.test(detail))
      throw new CairnProblem(
        'limit_exceeded',
        `could not write /workspace/${rel}: the workspace quota is used up (${detail})`,
      )
    throw new CairnProblem('forbidden', `could not write /workspace/${rel}: ${detail}`)
  }
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
