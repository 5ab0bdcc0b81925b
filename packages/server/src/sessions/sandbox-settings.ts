import type { AgentManifest, NetworkPolicy } from '@cairn/protocol'
import { DEFAULT_LIMITS, DEFAULT_TURN_TIMEOUT_MS, type SandboxLimits } from '@cairn/runtime/port'
import type { OperatorLimits } from '../limits/operator-limits.js'
import type { SessionRow } from './session-store.js'

/**
 * What a session's sandboxes (the agent's and the setup phase's) may reach: the session's own
 * network policy, else the agent's manifest's; neither allows nothing.
 */
export function sessionNetwork(
  row: Pick<SessionRow, 'network_json'>,
  manifest: AgentManifest,
): NetworkPolicy {
  return (
    (row.network_json ? (JSON.parse(row.network_json) as NetworkPolicy) : manifest.network) ?? { allow: [] }
  )
}

/**
 * The manifest's sandbox limits, with the runtime's defaults for those it leaves out, never above
 * the operator's maxima (a revision deployed before a ceiling was lowered gets the ceiling).
 */
export function sandboxLimits(manifest: AgentManifest, ceilings: OperatorLimits): SandboxLimits {
  const limits = manifest.limits ?? {}
  return {
    memoryMiB: Math.min(limits.memoryMiB ?? DEFAULT_LIMITS.memoryMiB, ceilings.maxMemoryMiB),
    pids: Math.min(limits.pids ?? DEFAULT_LIMITS.pids, ceilings.maxPids),
    cpus: Math.min(limits.cpus ?? DEFAULT_LIMITS.cpus, ceilings.maxCpus),
  }
}

/** The manifest's turn timeout (else the runtime's default), never above the operator's maximum. */
export function turnTimeoutMs(manifest: AgentManifest, ceilings: OperatorLimits): number {
  return Math.min(manifest.limits?.turnTimeoutMs ?? DEFAULT_TURN_TIMEOUT_MS, ceilings.maxTurnTimeoutMs)
}
