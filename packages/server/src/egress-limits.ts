import { CairnProblem } from '@cairn/protocol'
import { DEFAULT_EGRESS_LIMITS, type EgressLimits } from '@cairn/runtime/port'

/** Each sandbox's egress bounds as the operator sets them (`ServerOptions.egressLimits`). */
export type EgressLimitOptions = { [K in keyof EgressLimits]?: EgressLimits[K] | undefined }

const NUMBERS = [
  ['maxConnections', 'CAIRN_EGRESS_MAX_CONNECTIONS'],
  ['idleTimeoutMs', 'CAIRN_EGRESS_IDLE_TIMEOUT_MS'],
  ['maxLookups', 'CAIRN_EGRESS_MAX_LOOKUPS'],
  ['lookupTimeoutMs', 'CAIRN_EGRESS_LOOKUP_TIMEOUT_MS'],
] as const

/**
 * The bounds on each sandbox's egress: the options, else the environment, else the defaults
 * (`DEFAULT_EGRESS_LIMITS`). A value that is not a positive whole number is a start-up error.
 */
export function resolveEgressLimits(options: EgressLimitOptions | undefined): EgressLimits {
  const limits: EgressLimits = { ...DEFAULT_EGRESS_LIMITS }
  for (const [key, env] of NUMBERS) {
    const value = options?.[key] ?? (process.env[env] ? Number(process.env[env]) : undefined)
    if (value === undefined) continue
    if (!Number.isInteger(value) || value <= 0)
      throw new CairnProblem('validation_failed', `${env} must be a positive whole number, not '${value}'`)
    limits[key] = value
  }
  const servers =
    options?.dnsServers ??
    process.env.CAIRN_EGRESS_DNS_SERVERS?.split(',')
      .map((server) => server.trim())
      .filter(Boolean)
  if (servers && servers.length > 0) limits.dnsServers = servers
  return limits
}
