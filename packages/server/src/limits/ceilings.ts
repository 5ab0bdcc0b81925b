import { type AgentManifest, CairnProblem, type Limits } from '@cairn/protocol'
import { type OperatorLimits, operatorLimitSource } from './operator-limits.js'

const CEILING_OF: Record<keyof Limits, keyof OperatorLimits> = {
  memoryMiB: 'maxMemoryMiB',
  pids: 'maxPids',
  cpus: 'maxCpus',
  turnTimeoutMs: 'maxTurnTimeoutMs',
}

function refuse(where: string, limit: string, value: number, ceiling: number, source: string): never {
  throw new CairnProblem(
    'limit_above_ceiling',
    `${where}: ${limit} ${value} is above this server's maximum of ${ceiling} (set by the operator: ${source})`,
    { limit, value, ceiling },
  )
}

/** Refuses a manifest whose limits (or setup timeout) ask for more than the operator allows. */
export function checkManifestCeilings(manifest: AgentManifest, ceilings: OperatorLimits): void {
  const limits = manifest.limits ?? {}
  for (const key of Object.keys(CEILING_OF) as (keyof Limits)[]) {
    const value = limits[key]
    const ceilingName = CEILING_OF[key]
    if (value !== undefined && value > ceilings[ceilingName])
      refuse('cairn.yaml', `limits.${key}`, value, ceilings[ceilingName], operatorLimitSource(ceilingName))
  }
  for (const phase of ['setup', 'resume'] as const) {
    const declared = manifest.session?.[phase]
    if (declared && typeof declared === 'object' && !Array.isArray(declared))
      checkSetupTimeoutCeiling('cairn.yaml', `session.${phase}.timeoutMs`, declared.timeoutMs, ceilings)
  }
}

/** Refuses a setup phase (cairn.yaml's or a session's own) that may run longer than the operator allows. */
export function checkSetupTimeoutCeiling(
  where: string,
  limit: string,
  timeoutMs: number | undefined,
  ceilings: OperatorLimits,
): void {
  if (timeoutMs !== undefined && timeoutMs > ceilings.maxSetupTimeoutMs)
    refuse(where, limit, timeoutMs, ceilings.maxSetupTimeoutMs, operatorLimitSource('maxSetupTimeoutMs'))
}
