import { CairnProblem, type SetupInfo, type SnapshotInfo } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { AgentService } from '../agents/agent-service.js'
import type { ArchiveLimits } from '../agents/archive.js'
import type { Clock } from '../clock.js'
import type { Db } from '../db/database.js'
import type { ManualSnapshotCap } from '../limits/snapshot-cap.js'
import type { StorageBudget } from '../limits/storage-budget.js'
import type { SessionService } from '../sessions/session-service.js'
import type { SessionRow } from '../sessions/session-store.js'

export interface WorkspaceServiceDeps {
  db: Db
  /** The runtime, only through its port. */
  runtime: RuntimePort
  /** The runtime's default sandbox driver and storage driver, for the manifest. */
  runtimeDrivers: { isolation: string; storage: string }
  sessions: SessionService
  agents: AgentService
  clock: Clock
  logger: Logger
  /** Limits of an imported archive (the same checks as a deploy). */
  archiveLimits?: ArchiveLimits | undefined
  /** Automatic snapshots kept per session (manual ones are kept until deleted). */
  keepAutoSnapshots?: (tenantId: string) => Promise<number>
  /** The session's setup phase, for the manifest. */
  setupOf?: (sessionId: string) => Promise<SetupInfo | undefined>
  /** How many manual snapshots a session and a tenant may keep. */
  manualSnapshotCap: ManualSnapshotCap
  /** The tenant's storage budget: a merge reserves the bytes it writes in it first. */
  storageBudget?: StorageBudget | undefined
}

/** Restores and imports swap the live workspace: reads that meet one answer `session_busy`. */
export const SWAPS_WORKSPACE = true
/** Listings and diffs walk many entries: one that overlapped a swap answers `session_busy`, not a mix. */
export const WALK = true

/**
 * Puts the workspace back to `before` (the snapshot a merge or a merged import takes first) after
 * `error` stopped the write part way, as a restore would: a new generation, its marker first.
 * Returns the error to answer: the write's. A rollback needs room of its own: where it fails too
 * (at a full quota), the write's error still, saying so and naming the snapshot to restore
 * (`details.snapshotId`), which stays; the rollback's own error went unexplained before.
 */
export async function rollBack(
  deps: Pick<WorkspaceServiceDeps, 'runtime' | 'sessions' | 'logger'>,
  row: SessionRow,
  before: SnapshotInfo,
  error: unknown,
): Promise<unknown> {
  try {
    const generation = (await deps.sessions.store.generationOf(row.id)) + 1
    await deps.runtime.restoreWorkspace(row.id, before.id, generation, row.tenant_id)
    await deps.sessions.setGeneration(row.id, generation)
    return error
  } catch (rollbackError) {
    deps.logger.warn({ err: rollbackError, session: row.id, snapshot: before.id }, 'a rollback failed')
    if (!(error instanceof CairnProblem)) return error
    return new CairnProblem(
      error.code,
      `${error.message}; the workspace may keep part of the write: putting it back to snapshot ${before.id} failed too (${(rollbackError as Error).message}), restore that snapshot`,
      { ...error.details, snapshotId: before.id },
    )
  }
}
