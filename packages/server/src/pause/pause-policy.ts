import { type AgentManifest, CairnProblem, type PausePolicy } from '@cairn/protocol'
import type { AgentPause, PauseEvent, RuntimePort } from '@cairn/runtime/port'
import { type Clock, iso } from '../clock.js'
import type { SessionRow, SessionStore } from '../sessions/session-store.js'

/**
 * Refuses (`invalid_manifest`) `pause: memory` for an agent whose sandbox driver can neither
 * checkpoint memory nor keep a paused sandbox frozen in place on this node, with the driver's
 * reasons: a deploy must not promise what will not happen.
 */
export async function checkPausePolicy(
  manifest: AgentManifest,
  runtime: Pick<RuntimePort, 'sandboxDriver'>,
): Promise<void> {
  if (manifest.pause === 'memory')
    await checkPauseCapable(manifest, runtime, 'invalid_manifest', 'cairn.yaml: ')
}

/** `pause: memory` needs `memorySnapshot` (checkpoints) or `residentPause` (frozen in place). */
async function checkPauseCapable(
  manifest: Pick<AgentManifest, 'isolation'>,
  runtime: Pick<RuntimePort, 'sandboxDriver'>,
  code: 'invalid_manifest' | 'bad_request',
  prefix: string,
): Promise<void> {
  const driver = await runtime.sandboxDriver(manifest.isolation)
  if (driver.capabilities.memorySnapshot || driver.capabilities.residentPause) return
  const why = driver.unavailableBecause
  const reason = [why?.memorySnapshot, why?.residentPause].filter(Boolean).join('; ')
  throw new CairnProblem(
    code,
    `${prefix}pause: memory needs a sandbox driver that checkpoints memory or keeps a paused sandbox frozen in place, and ${driver.name} on this node does neither${reason ? `: ${reason}` : ''}`,
    { driver: driver.name, capability: 'memorySnapshot', ...(reason ? { reason } : {}) },
  )
}

/**
 * Refuses (`bad_request`) a session's own `pause: memory` when its agent's sandbox driver can do
 * neither on this node, with the driver's reasons (as a deploy of such an agent is).
 */
export async function checkSessionPause(
  pause: PausePolicy,
  manifest: Pick<AgentManifest, 'isolation'>,
  runtime: Pick<RuntimePort, 'sandboxDriver'>,
): Promise<void> {
  if (pause === 'memory') await checkPauseCapable(manifest, runtime, 'bad_request', '')
}

/**
 * Refuses (`bad_request`) `what` (a snapshot with memory) for a session whose agent's sandbox
 * driver cannot checkpoint memory on this node, with the driver's reason.
 */
export async function checkMemoryCapable(
  manifest: Pick<AgentManifest, 'isolation'>,
  runtime: Pick<RuntimePort, 'sandboxDriver'>,
  what: string,
  code: 'bad_request' | 'capability_unavailable' = 'bad_request',
): Promise<void> {
  const driver = await runtime.sandboxDriver(manifest.isolation)
  if (driver.capabilities.memorySnapshot) return
  const reason = driver.unavailableBecause?.memorySnapshot
  throw new CairnProblem(
    code,
    `${what} needs a sandbox driver that checkpoints memory, and this agent's (${driver.name}) cannot${reason ? `: ${reason}` : ''}`,
    { driver: driver.name, capability: 'memorySnapshot', ...(reason ? { reason } : {}) },
  )
}

/**
 * The runtime's `pause` for a session of a `pause: memory` agent: its checkpoint is tied to the
 * workspace generation now (what becomes of it comes back as `RuntimeEvents.pause`).
 */
export async function sessionPause(
  row: Pick<SessionRow, 'id' | 'pause'>,
  manifest: Pick<AgentManifest, 'pause'>,
  store: Pick<SessionStore, 'generationOf'>,
): Promise<AgentPause | undefined> {
  // The session's own policy, if it was given one, over its agent's.
  if ((row.pause ?? manifest.pause) !== 'memory') return undefined
  return { generation: await store.generationOf(row.id) }
}

/** What became of a session's memory checkpoint, recorded in its events at its status now. */
export async function recordPauseEvent(
  store: Pick<SessionStore, 'statusOf' | 'note'>,
  clock: Clock,
  sessionId: string,
  event: PauseEvent,
): Promise<void> {
  // The status now, not at the start: the checkpoint is taken when the session has gone idle.
  const status = await store.statusOf(sessionId)
  if (status) await store.note({ id: sessionId, status }, event.cause, iso(clock.now()), event.detail)
}
