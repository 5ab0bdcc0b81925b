import { createHash } from 'node:crypto'
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
