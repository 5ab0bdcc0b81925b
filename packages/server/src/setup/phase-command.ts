import { type NetworkPolicy, resolvePersistPaths } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import { Redactor } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { AgentService } from '../agents/agent-service.js'
import type { StoredRevision } from '../agents/agent-store.js'
import type { Clock } from '../clock.js'
import type { Db } from '../db/database.js'
import type { OperatorLimits } from '../limits/operator-limits.js'
import type { SecretStore } from '../secrets/secret-store.js'
import { sandboxLimits, sessionNetwork } from '../sessions/sandbox-settings.js'
import type { SessionRow } from '../sessions/session-store.js'

// A session's phases (`session.setup` once before the first turn, `session.resume` before a cold
// start on an existing workspace) run their command the same way: this is that one way.

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
