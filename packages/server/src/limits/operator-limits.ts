import os from 'node:os'
import { CairnProblem } from '@cairn/protocol'
import { type Static, Type } from '@sinclair/typebox'
import { connectionCeiling, descriptorLimit } from '../http/admission.js'

/**
 * The operator's maxima: the most an agent's manifest or a session may ask for, and how many
 * sandboxes, manual snapshots, API keys and requests one tenant may have. Server option
 * `operatorLimits`, else the environment variable named beside each, else the default.
 */
export const OperatorLimitsSchema = Type.Object({
  /** Ceiling of `limits.memoryMiB` (`CAIRN_MAX_MEMORY_MIB`). */
  maxMemoryMiB: Type.Number(),
  /** Ceiling of `limits.pids` (`CAIRN_MAX_PIDS`). */
  maxPids: Type.Number(),
  /** Ceiling of `limits.cpus` (`CAIRN_MAX_CPUS`; default: this host's CPUs). */
  maxCpus: Type.Number(),
  /** Ceiling of `limits.turnTimeoutMs` (`CAIRN_MAX_TURN_TIMEOUT_MS`). */
  maxTurnTimeoutMs: Type.Number(),
  /** Ceiling of a setup phase's `timeoutMs`, in cairn.yaml or at session creation (`CAIRN_MAX_SETUP_TIMEOUT_MS`). */
  maxSetupTimeoutMs: Type.Number(),
  /** Agent sandboxes one tenant may have running at once (`CAIRN_MAX_SANDBOXES_PER_TENANT`). */
  maxSandboxesPerTenant: Type.Number(),
  /**
   * How long a message waits for one of its tenant's sandboxes to be free when all are running
   * turns, before it is refused `sandbox_limit_reached`; 0 refuses at once (`CAIRN_SANDBOX_WAIT_MS`).
   */
  sandboxWaitMs: Type.Number(),
  /** Builds (dependencies, `setup`) one tenant may run at once (`CAIRN_MAX_BUILDS_PER_TENANT`). */
  maxBuildsPerTenant: Type.Number(),
  /** Manual snapshots one session may keep (`CAIRN_MAX_SNAPSHOTS_PER_SESSION`). */
  maxManualSnapshotsPerSession: Type.Number(),
  /** Manual snapshots one tenant may keep over all its sessions (`CAIRN_MAX_SNAPSHOTS_PER_TENANT`). */
  maxManualSnapshotsPerTenant: Type.Number(),
  /** Active API keys one tenant may hold (`CAIRN_MAX_KEYS_PER_TENANT`). */
  maxKeysPerTenant: Type.Number(),
  /**
   * Requests per second of all of a tenant's keys together, twice that as a burst; 0 turns it off
   * (`CAIRN_TENANT_RATE_LIMIT`; default: the per-key rate).
   */
  tenantRateLimitPerSecond: Type.Number(),
  /**
   * Connections the API and preview listeners may hold together (`CAIRN_MAX_CONNECTIONS`; default
   * and ceiling: the descriptor limit less the runtime's reserve, a quarter of it and at least 256).
   */
  maxConnections: Type.Number(),
  /** Connections one peer (an IPv4 address, an IPv6 /64) may hold (`CAIRN_MAX_CONNECTIONS_PER_PEER`). */
  maxConnectionsPerPeer: Type.Number(),
  /** Time a connection has to send a request's headers, its first from its start (`CAIRN_HEADERS_TIMEOUT_MS`). */
  headersTimeoutMs: Type.Number(),
  /** Time a keep-alive connection with no request in flight is kept (`CAIRN_IDLE_TIMEOUT_MS`). */
  idleTimeoutMs: Type.Number(),
  /** Time a request has to arrive whole, its body included (`CAIRN_REQUEST_TIMEOUT_MS`). */
  requestTimeoutMs: Type.Number(),
})
export type OperatorLimits = Static<typeof OperatorLimitsSchema>
/** The maxima given as server options (each left out or undefined: the environment's, else the default). */
export type OperatorLimitOptions = { [K in keyof OperatorLimits]?: number | undefined }

const ENV: Record<keyof OperatorLimits, string> = {
  maxMemoryMiB: 'CAIRN_MAX_MEMORY_MIB',
  maxPids: 'CAIRN_MAX_PIDS',
  maxCpus: 'CAIRN_MAX_CPUS',
  maxTurnTimeoutMs: 'CAIRN_MAX_TURN_TIMEOUT_MS',
  maxSetupTimeoutMs: 'CAIRN_MAX_SETUP_TIMEOUT_MS',
  maxSandboxesPerTenant: 'CAIRN_MAX_SANDBOXES_PER_TENANT',
  sandboxWaitMs: 'CAIRN_SANDBOX_WAIT_MS',
  maxBuildsPerTenant: 'CAIRN_MAX_BUILDS_PER_TENANT',
  maxManualSnapshotsPerSession: 'CAIRN_MAX_SNAPSHOTS_PER_SESSION',
  maxManualSnapshotsPerTenant: 'CAIRN_MAX_SNAPSHOTS_PER_TENANT',
  maxKeysPerTenant: 'CAIRN_MAX_KEYS_PER_TENANT',
  tenantRateLimitPerSecond: 'CAIRN_TENANT_RATE_LIMIT',
  maxConnections: 'CAIRN_MAX_CONNECTIONS',
  maxConnectionsPerPeer: 'CAIRN_MAX_CONNECTIONS_PER_PEER',
  headersTimeoutMs: 'CAIRN_HEADERS_TIMEOUT_MS',
  idleTimeoutMs: 'CAIRN_IDLE_TIMEOUT_MS',
  requestTimeoutMs: 'CAIRN_REQUEST_TIMEOUT_MS',
}

/** Where each maximum is set, for the messages that name it. */
export function operatorLimitSource(name: keyof OperatorLimits): string {
  return ENV[name]
}

export function defaultOperatorLimits(rateLimitPerSecond: number): OperatorLimits {
  return {
    maxMemoryMiB: 4096,
    maxPids: 4096,
    maxCpus: Math.max(1, os.availableParallelism()),
    maxTurnTimeoutMs: 3600 * 1000,
    maxSetupTimeoutMs: 3600 * 1000,
    maxSandboxesPerTenant: 64,
    sandboxWaitMs: 60_000,
    maxBuildsPerTenant: 4,
    maxManualSnapshotsPerSession: 100,
    maxManualSnapshotsPerTenant: 1000,
    maxKeysPerTenant: 20,
    tenantRateLimitPerSecond: rateLimitPerSecond,
    maxConnections: connectionCeiling(descriptorLimit()),
    maxConnectionsPerPeer: 512,
    headersTimeoutMs: 10_000,
    // Fastify's keep-alive default: above the 60 s idle timeout of common load balancers.
    idleTimeoutMs: 72_000,
    // A whole upload (100 MiB by default) at 175 KiB/s.
    requestTimeoutMs: 600_000,
  }
}

/** The options given, else the environment, else the defaults; a value that is not a number ≥ 0 stops the start. */
export function resolveOperatorLimits(
  given: OperatorLimitOptions | undefined,
  rateLimitPerSecond: number,
  env: NodeJS.ProcessEnv = process.env,
): OperatorLimits {
  const limits = defaultOperatorLimits(rateLimitPerSecond)
  for (const name of Object.keys(ENV) as (keyof OperatorLimits)[]) {
    const raw = given?.[name] ?? env[ENV[name]]
    if (raw === undefined || raw === '') continue
    const value = Number(raw)
    const zeroAllowed = name === 'tenantRateLimitPerSecond' || name === 'sandboxWaitMs'
    if (!Number.isFinite(value) || value < 0 || (value === 0 && !zeroAllowed))
      throw new CairnProblem(
        'validation_failed',
        `${ENV[name]} (${name}) must be a positive number${zeroAllowed ? ' or 0' : ''}, not '${raw}'`,
      )
    limits[name] = value
  }
  return limits
}
