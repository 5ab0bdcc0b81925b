import { constants } from 'node:os'
import { CairnProblem } from '@cairn/protocol'

const { EDQUOT, ENOSPC } = constants.errno

/**
 * A pool write refused for space, as its typed problem (undefined for any other failure): EDQUOT,
 * a quota of the tenant's or of the workspace's, is `quota_exceeded` (507); ENOSPC, the pool itself
 * full, is `storage_error`. `errno` as Node gives it (negative; it names EDQUOT only as "Unknown
 * system error -122") or as the kernel does.
 */
export function spaceProblem(errno: unknown, what: string): CairnProblem | undefined {
  const refused = typeof errno === 'number' ? Math.abs(errno) : undefined
  if (refused === EDQUOT)
    return new CairnProblem('quota_exceeded', `${what} failed: the quota is used up (Disk quota exceeded)`)
  if (refused === ENOSPC)
    return new CairnProblem(
      'storage_error',
      `${what} failed: the storage pool is full (No space left on device)`,
    )
  return undefined
}

/** `error` as `spaceProblem` types it when it is a refusal for space, else `error` itself. */
export function asSpaceProblem(error: unknown, what: string): unknown {
  return spaceProblem((error as { errno?: unknown } | undefined)?.errno, what) ?? error
}
