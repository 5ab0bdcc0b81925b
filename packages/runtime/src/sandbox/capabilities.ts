import { CairnProblem } from '@cairn/protocol'
import type { DriverCapabilities, SandboxDriver } from './driver.js'

/**
 * Refuses an operation the driver declares it cannot do, with a typed error instead of a silent
 * no-op: `bad_request`, with the driver and the capability in the details.
 */
export function requireCapability(
  driver: SandboxDriver,
  capability: keyof DriverCapabilities,
  action: string,
): void {
  if (driver.capabilities[capability]) return
  const reason = driver.unavailableBecause?.[capability]
  throw new CairnProblem(
    'bad_request',
    `the ${driver.name} sandbox driver cannot ${action}${reason ? `: ${reason}` : ''}`,
    { driver: driver.name, capability, ...(reason ? { reason } : {}) },
  )
}
