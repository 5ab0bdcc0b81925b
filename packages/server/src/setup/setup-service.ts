import {
  type AgentManifest,
  CairnProblem,
  type SessionSetup,
  type SetupInfo,
  type SetupStatus,
} from '@cairn/protocol'
import { iso } from '../clock.js'
import type { SessionRow } from '../sessions/session-store.js'
import { runPhaseCommand, type SetupServiceDeps } from './phase-command.js'
import { ResumePhase } from './resume-phase.js'
import { logTail, SetupStore } from './setup-store.js'

/** `session.setup` of cairn.yaml in the API's shape (a bare command is a string or an argv). */
export function manifestSetup(manifest: AgentManifest): SessionSetup | undefined {
  const setup = manifest.session?.setup
  if (setup === undefined) return undefined
  return typeof setup === 'string' || Array.isArray(setup) ? { command: setup } : setup
}

/**
 * The setup phase of a session: its command runs once, before the first turn, in a sandbox on the
 * session's workspace, with the agent's `setup`-scoped secrets and the setup network policy; the
 * log is kept, a snapshot follows success. A failed setup runs again on the next turn.
 */
export class SetupService {
  readonly store: SetupStore
  /** The `session.resume` command, run before a cold start on an existing workspace. */
  readonly resume: ResumePhase
  private afterSuccess: ((row: SessionRow) => Promise<string>) | undefined
  private afterWrite: ((sessionId: string) => Promise<unknown>) | undefined

  constructor(private readonly deps: SetupServiceDeps) {
    this.store = new SetupStore(deps.db)
    this.resume = new ResumePhase({ ...deps, afterWrite: async (id) => this.afterWrite?.(id) })
  }

  /** Called after a successful setup; answers the ID of the snapshot it took. */
  onSucceeded(hook: (row: SessionRow) => Promise<string>): void {
    this.afterSuccess = hook
  }

  /** Called once a setup command has run on the workspace (it wrote it: a new generation). */
  onWorkspaceWritten(hook: (sessionId: string) => Promise<unknown>): void {
    this.afterWrite = hook
  }

  async record(sessionId: string, setup: SessionSetup): Promise<void> {
    await this.store.insert(sessionId, setup)
  }

  async info(sessionId: string): Promise<SetupInfo> {
    const info = await this.store.info(sessionId)
    if (!info) throw new CairnProblem('not_found', `session ${sessionId} has no setup phase`)
    return info
  }

  async log(sessionId: string): Promise<string> {
    const log = await this.store.log(sessionId)
    if (log === undefined) throw new CairnProblem('not_found', `session ${sessionId} has no setup phase`)
    return log
  }

  /** Runs the setup; throws `setup_failed` (with the log tail in details) when it does not succeed. */
  async run(row: SessionRow, signal?: AbortSignal): Promise<void> {
    const setup = await this.store.get(row.id)
    if (!setup) return
    const revision = await this.deps.agents.store.revision(row.revision_id)
    if (!revision) throw new CairnProblem('revision_not_found', `revision ${row.revision_id} is gone`)
    await this.store.start(row.id, iso(this.deps.clock.now()))
    const phase = { name: 'setup' as const, ...setup }
    const { exitCode, error, log } = await runPhaseCommand(this.deps, row, revision, phase, signal)
    // Even a failed setup may have written files. The new generation comes before the snapshot
    // after setup, so that snapshot carries it.
    if (this.afterWrite) {
      await this.afterWrite(row.id).catch((caught: unknown) =>
        this.deps.logger.warn(
          { err: caught, session: row.id },
          'workspace generation not advanced after setup',
        ),
      )
    }
    await this.store.finish(row.id, {
      status: error ? 'failed' : 'succeeded',
      exitCode,
      error,
      log,
      at: iso(this.deps.clock.now()),
    })
    if (error) {
      const tail = logTail(log)
      throw new CairnProblem('setup_failed', `${error}${tail ? `; last lines:\n${tail}` : ''}`, {
        exitCode,
        logTail: tail,
      })
    }
    if (this.afterSuccess) await this.store.setSnapshot(row.id, await this.afterSuccess(row))
  }
}

/** Whether a session whose setup phase is in `status` (null: it has none) must run it first. */
export function needsSetup(status: SetupStatus | null): boolean {
  return status !== null && status !== 'succeeded'
}
