import { createHash } from 'node:crypto'
import { statfsSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

/** The agent-kit package (shims and helper libraries copied into every sandbox at /opt/cairn). */
export const AGENT_KIT_DIR = fileURLToPath(new URL('../../agent-kit/', import.meta.url))

/**
 * Host directory for one Cairn instance's runtime state. It lives under /run (world-traversable)
 * rather than under the data dir, because sandboxes run as an unprivileged host uid that must
 * reach its workspace even when the data dir sits in a private home directory.
 */
export function instanceRunDir(dataDir: string, base = '/run/cairn'): string {
  const hash = createHash('sha256').update(dataDir).digest('hex').slice(0, 12)
  return `${base}/${hash}`
}

/** statfs(2)'s f_type of a tmpfs. */
const TMPFS_MAGIC = 0x01021994

/**
 * Where one instance's agents' stderr files go (`RunDir.stderrFile`): on a tmpfs, whose pages
 * count in the memory cgroup of the process that writes them, so an agent (or a process it left
 * running between turns) writing stderr without end is stopped by its own memory limit instead of
 * filling the host's disk. /run is not a tmpfs on every host (ext4 on this project's CI machine);
 * /dev/shm is one wherever it exists. Beside the sandboxes' run dirs where it is not (stated in
 * docs/security.md: an idle agent's stderr is then bounded by nothing but its next turn).
 */
export function instanceStderrDir(runDir: string, shm = '/dev/shm'): string {
  try {
    if (statfsSync(shm).type === TMPFS_MAGIC) return path.join(shm, 'cairn-stderr', path.basename(runDir))
  } catch {}
  return path.join(runDir, 'sandboxes')
}
