import type { StoragePool } from '../storage/pool.js'
import type { MemoryCheckpoints } from './memory-checkpoints.js'

/**
 * Why a memory checkpoint of `bytes` may not be kept (undefined: it may). Checkpoints live beside
 * the pool, outside its btrfs quota groups, so they are charged here: a session's with its
 * workspace's referenced bytes against the workspace quota (`sessionId` given), and any with the
 * tenant's trees and its other checkpoints (in `stores`) against the tenant quota. Only where the
 * pool enforces quotas. `except`: the checkpoint being charged, not counted twice.
 */
export async function checkpointOverQuota(
  pool: StoragePool,
  stores: readonly MemoryCheckpoints[],
  tenantId: string,
  bytes: number,
  { sessionId, except }: { sessionId?: string; except: string },
): Promise<string | undefined> {
  const quotas = pool.quotaStatus()
  if (!quotas.enforced) return undefined
  if (quotas.workspaceBytes !== undefined && sessionId !== undefined) {
    const used = (await pool.usage(pool.workspacePath(sessionId))).referencedBytes
    if (used + bytes > quotas.workspaceBytes)
      return `its ${bytes} bytes with the workspace's ${used} bytes exceed the workspace quota of ${quotas.workspaceBytes} bytes`
  }
  if (quotas.tenantBytes !== undefined) {
    const trees = (await pool.tenantUsage([tenantId])).get(tenantId)?.exclusiveBytes ?? 0
    let others = 0
    for (const store of stores) others += await store.tenantBytes(tenantId, except)
    if (trees + others + bytes > quotas.tenantBytes)
      return `its ${bytes} bytes with the tenant's ${trees + others} bytes exceed the tenant quota of ${quotas.tenantBytes} bytes`
  }
  return undefined
}
