import type { EgressCa } from '../egress/egress-ca.js'
import { EgressProxy } from '../egress/proxy.js'
import type { RunDir } from './run-dir.js'
import type { AgentLaunch } from './types.js'

/** An agent's way out: its egress proxy, and whether its sandbox must trust the egress CA. */
export interface AgentEgress {
  proxy: EgressProxy
  /** Set once TLS is terminated for a proxy secret: the sandbox trusts the egress CA. */
  trustsCa: boolean
}

/**
 * Starts the agent's egress proxy on a socket in its run dir when the launch has an allowlist
 * (undefined otherwise: loopback only). With proxy secrets, the per-install CA is loaded and
 * written where the sandbox reads it.
 */
export async function startAgentEgress(
  egress: AgentLaunch['egress'],
  runDir: RunDir,
  egressCa: (() => Promise<EgressCa>) | undefined,
): Promise<AgentEgress | undefined> {
  if (!egress || egress.policy.allow.length === 0) return undefined
  const secrets = egress.secrets ?? []
  const ca = secrets.length > 0 && egressCa ? await egressCa() : undefined
  if (ca) await runDir.writeTrustedCa(ca)
  const proxy = new EgressProxy({ ...egress, socketPath: runDir.file('egress.sock'), secrets, ca })
  try {
    await proxy.listen()
  } catch (error) {
    await proxy.close().catch(() => undefined)
    throw error
  }
  return { proxy, trustsCa: ca !== undefined }
}
