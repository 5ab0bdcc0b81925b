import type { TestServer } from './server.js'

/**
 * Closes a test server after asserting the pool's invariant: no tree without a limited owner
 * (`BtrfsPool.unownedTrees`, packages/runtime/src/storage/pool-owners.ts). The server is closed
 * (and its pool unmounted) either way; offenders fail the file's afterAll, each named.
 */
export async function closeOwned(t: TestServer | undefined): Promise<void> {
  if (!t) return
  let offenders: string[] = []
  try {
    const pool = t.server.runtime.pool as { unownedTrees?: () => Promise<string[]> }
    offenders = (await pool.unownedTrees?.()) ?? []
  } finally {
    await t.close()
  }
  if (offenders.length > 0)
    throw new Error(`trees in the pool without a limited owner:\n${offenders.join('\n')}`)
}
