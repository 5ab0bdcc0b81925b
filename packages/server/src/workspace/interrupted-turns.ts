import type { InterruptedTurn } from '../sessions/session-store.js'
import type { SnapshotStore } from '../snapshots/snapshot-store.js'
import type { SnapshotPolicy } from './snapshot-policy.js'
import type { WorkspaceServiceDeps } from './workspace-deps.js'

/**
 * After a crash, gives every interrupted turn its pre-turn snapshot. The prompt reaches the agent
 * only once that snapshot is recorded, so a turn without one never ran: its workspace is still
 * the state before it, and the snapshot taken now is exact. (Either the transcript shows the turn
 * and the snapshot before it exists, or neither.)
 */
export async function completeInterruptedTurns(
  deps: WorkspaceServiceDeps,
  snapshots: SnapshotStore,
  policy: SnapshotPolicy,
  turns: InterruptedTurn[],
): Promise<number> {
  let taken = 0
  for (const turn of turns) {
    const row = await deps.sessions.store.get(turn.tenantId, turn.sessionId)
    if (!row?.auto_snapshots || row.status === 'deleted' || row.status_cause === 'state_lost') continue
    if (await snapshots.atTurn(row.id, turn.seq - 1)) continue
    if (!(await deps.runtime.hasWorkspace(row.id))) continue
    await policy.take(row, 'auto', 'before_turn', turn.seq - 1)
    taken++
  }
  return taken
}
