import type { SessionRow, SessionStore } from './session-store.js'

/** How often the session's owner epoch is read while a verdict is awaited. */
const POLL_MS = 100

/**
 * A turn's node broke its stream (`node_unavailable`): killed, or out of reach for a moment. The
 * leader's verdict is waited for, up to `verdictMs` (the nodes' lease and a check; undefined: a
 * single process, nothing to wait for): a node declared lost moves the session's owner epoch on,
 * and the turn ends `node_lost` (the leader's record) instead of `node_unavailable`; a node still
 * serving after it, as it was.
 */
export async function awaitNodeVerdict(
  store: Pick<SessionStore, 'ownerEpochForUpdate'>,
  row: Pick<SessionRow, 'id' | 'owner_epoch'>,
  verdictMs: number | undefined,
): Promise<void> {
  if (verdictMs === undefined) return
  const until = performance.now() + verdictMs
  while (performance.now() < until) {
    const epoch = await store.ownerEpochForUpdate(row.id).catch(() => row.owner_epoch)
    if (epoch !== row.owner_epoch) return
    await new Promise((resolve) => setTimeout(resolve, POLL_MS))
  }
}
