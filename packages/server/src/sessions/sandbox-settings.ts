import type { AgentManifest, NetworkPolicy } from '@cairn/protocol'
import { DEFAULT_LIMITS, type SandboxLimits } from '@cairn/runtime'
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

/** The manifest's sandbox limits, with the runtime's defaults for those it leaves out. */
export function sandboxLimits(manifest: AgentManifest): SandboxLimits {
  const limits = manifest.limits ?? {}
  return {
    memoryMiB: limits.memoryMiB ?? DEFAULT_LIMITS.memoryMiB,
    pids: limits.pids ?? DEFAULT_LIMITS.pids,
    cpus: limits.cpus ?? DEFAULT_LIMITS.cpus,
  }
}
