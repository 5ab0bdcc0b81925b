import { type AgentManifest, CairnProblem, type ResumeInfo } from '@cairn/protocol'
import { iso } from '../clock.js'
import type { SessionRow } from '../sessions/session-store.js'
import { type PhaseCommand, runPhaseCommand, type SetupServiceDeps } from './phase-command.js'
import { logTail } from './setup-store.js'

/** `session.resume` of cairn.yaml in a normalized form (a bare command runs through `sh -c`). */
export function manifestResume(manifest: AgentManifest): PhaseCommand | undefined {
  const resume = manifest.session?.resume
  if (resume === undefined) return undefined
  const phase = typeof resume === 'string' || Array.isArray(resume) ? { command: resume } : resume
  return {
    name: 'resume',
    command: typeof phase.command === 'string' ? ['sh', '-c', phase.command] : phase.command,
    env: ('env' in phase ? phase.env : undefined) ?? {},
    network: 'network' in phase ? phase.network : undefined,
    timeoutMs: 'timeoutMs' in phase ? phase.timeoutMs : undefined,
  }
}

/**
 * The resume phase: the agent's `session.resume` command runs when a cold sandbox starts on a
 * workspace a turn has run on (not right after the setup phase), before the agent, in its own
 * sandbox as the setup phase does. The latest run and its log are kept per session; a failure
 * throws `resume_failed` (the turn fails, the session is `failed` and runs it again on the next
 * message).
 */
export class ResumePhase {
  constructor(
    private readonly deps: SetupServiceDeps & {
      /** Called once the command ran (it may have written the workspace: a new generation). */
      afterWrite?: ((sessionId: string) => Promise<unknown>) | undefined
    },
  ) {}

  /**
   * Whether a cold start of the session now is on an existing workspace (see the class): a turn
   * has ended, and the setup phase has not run since the last one (the workspace is fresh from
   * it then). One query.
   */
  private async due(row: SessionRow): Promise<boolean> {
    const found = await this.deps.db.q
      .selectFrom('turns as t')
      .leftJoin('session_setups as s', 's.session_id', 't.session_id')
      .select((eb) => [
        eb.fn.max<string | null>('t.ended_at').as('lastTurnAt'),
        eb.fn.max('s.ended_at').as('setupAt'),
      ])
      .where('t.session_id', '=', row.id)
      .executeTakeFirst()
    const lastTurnAt = found?.lastTurnAt
    if (!lastTurnAt) return false
    const setupAt = found.setupAt as string | null
    return !setupAt || setupAt <= lastTurnAt
  }

  /** Runs the command if the agent declares one and it is due; throws `resume_failed` when it fails. */
  async runIfDue(row: SessionRow, signal?: AbortSignal): Promise<void> {
    const revision = await this.deps.agents.store.revision(row.revision_id)
    const phase = revision ? manifestResume(revision.manifest) : undefined
    if (!revision || !phase || !(await this.due(row))) return
    const { db, clock } = this.deps
    const started = {
      command_json: JSON.stringify(phase.command),
      status: 'running',
      exit_code: null,
      error: null,
      log: '',
      started_at: iso(clock.now()),
      ended_at: null,
    }
    await db.q
      .insertInto('session_resume_runs')
      .values({ session_id: row.id, runs: 1, ...started })
      .onConflict((oc) =>
        oc
          .column('session_id')
          .doUpdateSet((eb) => ({ ...started, runs: eb('session_resume_runs.runs', '+', 1) })),
      )
      .execute()
    const { exitCode, error, log } = await runPhaseCommand(this.deps, row, revision, phase, signal)
    await this.deps
      .afterWrite?.(row.id)
      .catch((caught: unknown) =>
        this.deps.logger.warn(
          { err: caught, session: row.id },
          'workspace generation not advanced after resume',
        ),
      )
    await db.q
      .updateTable('session_resume_runs')
      .set({
        status: error ? 'failed' : 'succeeded',
        exit_code: exitCode,
        error,
        log,
        ended_at: iso(clock.now()),
      })
      .where('session_id', '=', row.id)
      .execute()
    if (!error) return
    const tail = logTail(log)
    throw new CairnProblem('resume_failed', `${error}${tail ? `; last lines:\n${tail}` : ''}`, {
      exitCode,
      logTail: tail,
    })
  }

  private async row(sessionId: string) {
    const row = await this.deps.db.q
      .selectFrom('session_resume_runs')
      .selectAll()
      .where('session_id', '=', sessionId)
      .executeTakeFirst()
    if (!row) throw new CairnProblem('not_found', `session ${sessionId} has not run a resume command`)
    return row
  }

  async info(sessionId: string): Promise<ResumeInfo> {
    const row = await this.row(sessionId)
    return {
      sessionId,
      status: row.status as ResumeInfo['status'],
      command: JSON.parse(row.command_json) as string[],
      runs: Number(row.runs),
      exitCode: row.exit_code,
      error: row.error,
      startedAt: row.started_at,
      endedAt: row.ended_at,
      logTail: logTail(row.log),
    }
  }

  async log(sessionId: string): Promise<string> {
    return (await this.row(sessionId)).log
  }

  /** Runs a crash left running become failed. */
  async recoverAfterRestart(runtimeId: string): Promise<void> {
    await this.deps.db.q
      .updateTable('session_resume_runs')
      .set({ status: 'failed', error: 'the server stopped while the resume command ran' })
      .where('status', '=', 'running')
      .where('session_id', 'in', (eb) =>
        eb.selectFrom('sessions').select('id').where('runtime_id', '=', runtimeId),
      )
      .execute()
  }
}
