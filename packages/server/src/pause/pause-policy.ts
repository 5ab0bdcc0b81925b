import { type AgentManifest, CairnProblem, type PausePolicy } from '@cairn/protocol'
import type { AgentPause, RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { SessionRow, SessionStore } from '../sessions/session-store.js'

/**
 * Refuses (`invalid_manifest`) `pause: memory` for an agent whose sandbox driver cannot checkpoint
 * memory on this node, with the driver's reason: a deploy must not promise what will not happen.
 */
export async function checkPausePolicy(
  manifest: AgentManifest,
  runtime: Pick<RuntimePort, 'sandboxDriver'>,
): Promise<void> {
  if (manifest.pause !== 'memory') return
  const driver = await runtime.sandboxDriver(manifest.isolation)
  if (driver.capabilities.memorySnapshot) return
  const reason = driver.unavailableBecause?.memorySnapshot
  throw new CairnProblem(
    'invalid_manifest',
    `cairn.yaml: pause: memory needs a sandbox driver that checkpoints memory, and ${driver.name} cannot${reason ? `: ${reason}` : ''}`,
    { driver: driver.name, capability: 'memorySnapshot', ...(reason ? { reason } : {}) },
  )
}

/**
 * Refuses (`bad_request`) a session's own `pause: memory` when its agent's sandbox driver cannot
 * checkpoint memory on this node, with the driver's reason (as a deploy of such an agent is).
 */
export async function checkSessionPause(
  pause: PausePolicy,
  manifest: Pick<AgentManifest, 'isolation'>,
  runtime: Pick<RuntimePort, 'sandboxDriver'>,
): Promise<void> {
  if (pause === 'memory') await checkMemoryCapable(manifest, runtime, 'pause: memory')
}

/**
 * Refuses (`bad_request`) `what` (a snapshot with memory) for a session whose agent's sandbox
 * driver cannot checkpoint memory on this node, with the driver's reason.
 */
export async function checkMemoryCapable(
  manifest: Pick<AgentManifest, 'isolation'>,
  runtime: Pick<RuntimePort, 'sandboxDriver'>,
  what: string,
): Promise<void> {
  const driver = await runtime.sandboxDriver(manifest.isolation)
  if (driver.capabilities.memorySnapshot) return
  const reason = driver.unavailableBecause?.memorySnapshot
  throw new CairnProblem(
    'bad_request',
    `${what} needs a sandbox driver that checkpoints memory, and this agent's (${driver.name}) cannot${reason ? `: ${reason}` : ''}`,
    { driver: driver.name, capability: 'memorySnapshot', ...(reason ? { reason } : {}) },
  )
}

/**
 * The runtime's `pause` for a session of a `pause: memory` agent: its checkpoint is tied to the
 * workspace generation now, and what becomes of it is recorded in the session's events.
 */
export async function sessionPause(
  row: Pick<SessionRow, 'id' | 'status' | 'tenant_id' | 'pause'>,
  manifest: Pick<AgentManifest, 'pause'>,
  store: SessionStore,
  clock: Clock,
  logger: Pick<Logger, 'warn'>,
): Promise<AgentPause | undefined> {
  // The session's own policy, if it was given one, over its agent's.
  if ((row.pause ?? manifest.pause) !== 'memory') return undefined
  return {
    generation: await store.generationOf(row.id),
    onEvent: ({ cause, detail }) => {
      // The status now, not at the start: the checkpoint is taken when the session has gone idle.
      const record = async () => {
        const status = (await store.get(row.tenant_id, row.id))?.status ?? row.status
        await store.note({ id: row.id, status }, cause, iso(clock.now()), detail)
      }
      void record().catch((error: unknown) =>
        logger.warn({ err: error, session: row.id }, 'recording a pause event failed'),
      )
    },
  }
}
