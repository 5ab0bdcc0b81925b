import type { TestServer } from './server.js'

/**
 * Closes a test server after asserting the pool's invariant: no tree without a limited owner
 * (`BtrfsPool.unownedTrees`, packages/runtime/src/storage/pool-owners.ts). The server is closed
 * (and its pool unmounted) either way; offenders fail the file's afterAll, each named. `afterClose`
 * runs once the server has stopped, before its data dir is removed (to read what it left there).
 */
export async function closeOwned(t: TestServer | undefined, afterClose?: () => Promise<void>): Promise<void> {
  if (!t) return
  let offenders: string[] = []
  try {
    const pool = t.server.runtime.pool as { unownedTrees?: () => Promise<string[]> }
    offenders = (await pool.unownedTrees?.()) ?? []
  } finally {
    try {
      if (afterClose) await t.server.close().finally(afterClose)
    } finally {
      await t.close()
    }
  }
  if (offenders.length > 0)
    throw new Error(`trees in the pool without a limited owner:\n${offenders.join('\n')}`)
}
