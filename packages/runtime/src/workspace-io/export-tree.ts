import { spawn } from 'node:child_process'
import type { Readable } from 'node:stream'
import { BACKGROUND_NICENESS } from './reader.js'

/** An export's stream is cut (its tar killed) after this long. */
export const EXPORT_TIMEOUT_MS = 30 * 60_000

/**
 * A tar.gz of a tree that nothing changes while it is read (a snapshot), made by GNU tar in a
 * child process (its own process group, killed by `stop` or after EXPORT_TIMEOUT_MS). Tar never
 * follows a link. The GNU format carries names as raw bytes, records FIFOs and devices without
 * opening them (sockets are left out), and `--sparse` seeks over holes.
 */
export function exportTree(dir: string): { stream: Readable; stop: () => Promise<void> } {
  // Not portable: modes and names are kept exactly (a read-only directory stays read-only
  // through export and import).
  // Under nice (inherited by the gzip tar starts): an export yields the CPU to the sessions' turns.
  const child = spawn(
    'nice',
    [
      '-n',
      String(BACKGROUND_NICENESS),
      'tar',
      '--create',
      '--gzip',
      '--format=gnu',
      '--sparse',
      '--sort=name',
      '--numeric-owner',
      // What the agent marked setuid or setgid must not become such a program where the archive
      // is unpacked (as an import drops the bits): the archive records every mode without them,
      // and without the sticky bit (GNU tar's --mode cannot tell files from directories, so a
      // sticky directory loses it too; on a file it means nothing).
      '--mode=ug-s,-t',
      '--one-file-system',
      '--directory',
      dir,
      '--file',
      '-',
      '.',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'], detached: true, env: { PATH: '/usr/bin:/bin', LC_ALL: 'C' } },
  )
  child.stderr.resume()
  const exited = new Promise<void>((resolve) => {
    child.once('close', () => resolve())
    child.once('error', () => resolve())
  })
  const killGroup = () => {
    if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) {
      try {
        process.kill(-child.pid, 'SIGKILL')
      } catch {
        // already gone
      }
    }
  }
  const timer = setTimeout(killGroup, EXPORT_TIMEOUT_MS)
  timer.unref()
  return {
    stream: child.stdout,
    stop: async () => {
      clearTimeout(timer)
      killGroup()
      await exited
    },
  }
}
