import {
  type AgentManifest,
  CairnProblem,
  type NetworkPolicy,
  resolvePersistPaths,
  type SessionSetup,
  type SetupInfo,
  type SetupStatus,
} from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { AgentService } from '../agents/agent-service.js'
import type { StoredRevision } from '../agents/agent-store.js'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import type { OperatorLimits } from '../limits/operator-limits.js'
import { Redactor } from '../secrets/redaction.js'
import type { SecretStore } from '../secrets/secret-store.js'
import { sandboxLimits, sessionNetwork } from '../sessions/sandbox-settings.js'
import type { SessionRow } from '../sessions/session-store.js'
import { ResumePhase } from './resume-phase.js'
import { logTail, SetupStore } from './setup-store.js'

export const DEFAULT_SETUP_TIMEOUT_MS = 10 * 60 * 1000
const MAX_LOG_BYTES = 1024 * 1024

export interface SetupServiceDeps {
  db: Db
  /** The runtime, only through its port: the setup command runs in the session's workspace. */
  runtime: RuntimePort
  agents: AgentService
  secrets: SecretStore
  /** The operator's maxima: the setup sandbox's limits and timeout never go above them. */
  operatorLimits: OperatorLimits
  clock: Clock
  logger: Logger
}

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

/** A phase's command as a session runs it (`session.setup`, `session.resume`). */
export interface PhaseCommand {
  name: 'setup' | 'resume'
  command: string[]
  env: Record<string, string>
  network: NetworkPolicy | undefined
  timeoutMs: number | undefined
}

/**
 * Runs a phase's command in a sandbox on the session's workspace, with the agent's `setup`-scoped
 * secrets (never the agent's sandbox), the phase's network policy (else the session's), its
 * timeout under the operator's ceiling; the log is redacted and keeps its last 1 MiB.
 */
export async function runPhaseCommand(
  deps: Pick<SetupServiceDeps, 'runtime' | 'agents' | 'secrets' | 'operatorLimits'>,
  row: SessionRow,
  revision: StoredRevision,
  phase: PhaseCommand,
  signal?: AbortSignal,
): Promise<{ exitCode: number | null; error: string | null; log: string }> {
  const { runtime, secrets } = deps
  const setupSecrets = await secrets.valuesForScope(row.tenant_id, row.agent_id, 'setup')
  const redactor = new Redactor(await secrets.values(row.agent_id, ['runtime', 'setup', 'proxy']))
  const policy: NetworkPolicy = phase.network ?? sessionNetwork(row, revision.manifest)
  const timeoutMs = Math.min(
    phase.timeoutMs ?? DEFAULT_SETUP_TIMEOUT_MS,
    deps.operatorLimits.maxSetupTimeoutMs,
  )
  let log = ''
  const append = (line: string) => {
    log += `${redactor.redact(line)}\n`
    if (log.length > MAX_LOG_BYTES) log = log.slice(log.length - MAX_LOG_BYTES)
  }
  let exitCode: number | null = null
  let error: string | null = null
  try {
    // Its network decisions reach the session's log through the port's `RuntimeEvents`.
    const result = await runtime.runCommand(
      {
        sessionId: row.id,
        isolation: revision.manifest.isolation,
        dependencyEnvKey: revision.manifest.envKey ?? undefined,
        command: phase.command,
        env: {
          HOME: '/tmp',
          ...phase.env,
          ...setupSecrets,
          CAIRN_SESSION_ID: row.id,
          CAIRN_PHASE: phase.name,
        },
        egress: { policy },
        imageKey: deps.agents.images.imageKeyOf(revision),
        limits: sandboxLimits(revision.manifest, deps.operatorLimits),
        timeoutMs,
        persist: resolvePersistPaths(revision.manifest.persist).map((p) => p.sandboxPath),
      },
      append,
      signal,
    )
    exitCode = result.code
    if (result.cancelled) error = `${phase.name} was cancelled`
    else if (result.timedOut) error = `${phase.name} ran past its timeout of ${timeoutMs} ms`
    else if (result.limit) error = `${phase.name} hit its ${result.limit} limit`
    else if (result.code !== 0) error = `${phase.name} exited with code ${result.code ?? result.signal}`
  } catch (caught) {
    error = `${phase.name} could not run: ${(caught as Error).message}`
  }
  return { exitCode, error, log }
}

/** Whether a session whose setup phase is in `status` (null: it has none) must run it first. */
export function needsSetup(status: SetupStatus | null): boolean {
  return status !== null && status !== 'succeeded'
}
