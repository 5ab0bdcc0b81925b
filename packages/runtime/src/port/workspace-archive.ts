import { chmod } from 'node:fs/promises'
import type { Runtime } from '../runtime.js'
import { unpackIntoWorkspace } from '../workspace-io/sandboxed-io.js'

/**
 * Replaces the session's workspace with an uploaded archive: unpacked into a staging tree of the
 * pool, which then takes the workspace's place at `generation`; a failed upload leaves the
 * workspace as it was.
 */
export async function replaceWithArchive(
  runtime: Runtime,
  sessionId: string,
  tenantId: string,
  archive: Buffer,
  generation: number,
): Promise<void> {
  const { pool } = runtime
  const staging = await pool.createWorkspaceStaging(
    `imp_${sessionId.slice(sessionId.indexOf('_') + 1)}`,
    tenantId,
  )
  try {
    await unpackIntoWorkspace(runtime, staging, archive)
    await chmod(staging, 0o700)
    await pool.replaceWorkspace(sessionId, staging, generation)
  } catch (error) {
    // The upload's error is the one to answer; a staging tree left behind is logged.
    await pool
      .discardStaging(staging)
      .catch((e: unknown) =>
        runtime.logger.warn({ err: e, staging }, 'discarding an upload staging tree failed'),
      )
    throw error
  }
}

/** Unpacks an archive over the session's workspace (see `unpackIntoWorkspace`). */
export async function unpackIntoSessionWorkspace(
  runtime: Runtime,
  sessionId: string,
  archive: Buffer,
): Promise<void> {
  const dir = runtime.pool.workspacePath(sessionId)
  await unpackIntoWorkspace(runtime, dir, archive)
  await chmod(dir, 0o700)
}
