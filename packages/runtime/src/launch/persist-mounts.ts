import { lstat, mkdir } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem, PERSIST_DIR, PERSIST_HOME } from '@cairn/protocol'
import type { SandboxBind } from '../sandbox/driver.js'

/** What a sandbox with persisted paths gets: their binds, the mask over their store, its home. */
export interface PersistLaunch {
  binds: SandboxBind[]
  home: string
  env: Record<string, string>
}

/**
 * Makes each persisted path's directory in the workspace subvolume (`.cairn-persist/<path>`) and
 * returns its bind at the declared sandbox path, then a read-only bind of `emptyDir` over
 * /workspace/.cairn-persist (the agent reaches its state only where it declared it). Runs before
 * the sandbox starts, when no process of the session runs: each component is checked with
 * `lstat` and a link or a non-directory is refused (`sandbox_failed`), never followed, so an
 * imported tree cannot point a bind elsewhere. `own` hands a made directory to the sandbox uid.
 */
export async function persistLaunch(
  workspaceDir: string,
  sandboxPaths: readonly string[],
  emptyDir: string,
  own: (dir: string) => Promise<void>,
): Promise<PersistLaunch | undefined> {
  if (sandboxPaths.length === 0) return undefined
  const binds: SandboxBind[] = []
  for (const dest of sandboxPaths) {
    const rel = [PERSIST_DIR, ...dest.split('/').filter(Boolean)]
    let dir = workspaceDir
    for (const name of rel) {
      dir = path.join(dir, name)
      await ensureDirectory(dir, own)
    }
    binds.push({ source: dir, dest, readOnly: false })
  }
  binds.push({ source: emptyDir, dest: `/workspace/${PERSIST_DIR}`, readOnly: true })
  return { binds, home: PERSIST_HOME, env: { HOME: PERSIST_HOME } }
}

async function ensureDirectory(dir: string, own: (dir: string) => Promise<void>): Promise<void> {
  const info = await lstat(dir).catch((error: NodeJS.ErrnoException) => {
    if (error.code === 'ENOENT') return undefined
    throw error
  })
  if (!info) {
    await mkdir(dir, { mode: 0o755 })
    await own(dir)
    return
  }
  if (!info.isDirectory() || info.isSymbolicLink())
    throw new CairnProblem(
      'sandbox_failed',
      `the persisted paths' store holds ${info.isSymbolicLink() ? 'a link' : 'a non-directory'} at ${path.basename(dir)}: restore a snapshot from before it was made`,
    )
}
