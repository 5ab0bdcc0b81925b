import type { AgentProcess } from '../agent/agent-process.js'
import type { StoragePool } from '../storage/pool.js'
import type { WorkspaceMark } from './runtime-port.js'

/**
 * Snapshots the session's workspace with its sandbox (when one runs) frozen, and marks the moment:
 * the sandbox, the workspace's change mark and the bytes its processes had written (see
 * `unchangedSince`); undefined where any of them cannot be told.
 */
export async function snapshotFrozen(
  pool: StoragePool,
  warm: AgentProcess | undefined,
  sessionId: string,
  snapshotId: string,
  tenantId: string,
): Promise<WorkspaceMark | undefined> {
  await warm?.freeze()
  try {
    const ctransid = await pool.snapshotWorkspace(sessionId, snapshotId, tenantId)
    // Read while still frozen: nothing the sandbox writes from here on is in the snapshot.
    const writtenBytes = warm?.writtenBytes()
    if (!warm || ctransid === undefined || writtenBytes === undefined) return undefined
    return { sandboxId: warm.sandboxId, ctransid, writtenBytes }
  } finally {
    await warm?.thaw()
  }
}

/**
 * The same sandbox still running (one that stopped in between could have written and gone), no
 * page of file data dirtied by its processes (buffered writes reach btrfs's trees only when
 * flushed), and no inode of the workspace updated (the subvolume's ctransid).
 */
export async function unchangedSince(
  pool: StoragePool,
  agent: AgentProcess | undefined,
  sessionId: string,
  mark: WorkspaceMark,
): Promise<boolean> {
  if (!agent?.alive || mark.sandboxId !== agent.sandboxId) return false
  // The change mark is asked first (the storage helper's round trip), the processes' written
  // bytes read while it is under way.
  const asked = pool.workspaceMark(sessionId).catch(() => undefined)
  const written = agent.writtenBytes()
  const ctransid = await asked
  if (written === undefined || written !== mark.writtenBytes) return false
  return ctransid !== undefined && ctransid === mark.ctransid
}
