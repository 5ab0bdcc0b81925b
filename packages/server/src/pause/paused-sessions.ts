import { type AgentManifest, CairnProblem } from '@cairn/protocol'
import type { AgentLaunch, AgentProcess, MemoryCheckpoints, Runtime } from '@cairn/runtime'
import { startFromCheckpoint } from '@cairn/runtime'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { SessionRow, SessionStore } from '../sessions/session-store.js'

export interface PausedSessionsDeps {
  runtime: Runtime
  store: SessionStore
  checkpoints: MemoryCheckpoints
  clock: Clock
  logger: Logger
}

/**
 * Refuses (`invalid_manifest`) `pause: memory` for an agent whose sandbox driver cannot checkpoint
 * memory on this node, with the driver's reason: a deploy must not promise what will not happen.
 */
export function checkPausePolicy(manifest: AgentManifest, runtime: Runtime): void {
  if (manifest.pause !== 'memory') return
  const driver = runtime.driverFor(manifest.isolation)
  if (driver.capabilities.memorySnapshot) return
  const reason = driver.unavailableBecause?.memorySnapshot
  throw new CairnProblem(
    'invalid_manifest',
    `cairn.yaml: pause: memory needs a sandbox driver that checkpoints memory, and ${driver.name} cannot${reason ? `: ${reason}` : ''}`,
    { driver: driver.name, capability: 'memorySnapshot', ...(reason ? { reason } : {}) },
  )
}

/**
 * Sessions of `pause: memory` agents: when keep-warm ends their sandbox is checkpointed (processes,
 * memory, listening sockets) instead of stopped, and the next message restores it. A checkpoint is
 * tied to the workspace generation; one the workspace has moved on from, or whose restore fails, is
 * dropped and the session starts cold, each with an event saying why.
 */
export class PausedSessions {
  constructor(private readonly deps: PausedSessionsDeps) {}

  /** Whether a session of this revision pauses with its memory here. */
  wants(manifest: Pick<AgentManifest, 'pause' | 'isolation'>): boolean {
    return (
      manifest.pause === 'memory' &&
      this.deps.runtime.driverFor(manifest.isolation).capabilities.memorySnapshot
    )
  }

  /**
   * Checkpoints the session's idle agent, which stops it. A checkpoint that fails leaves the
   * session as a stop would (the next message starts cold), with the reason in its events.
   */
  async pause(row: Pick<SessionRow, 'id' | 'status'>, agent: AgentProcess): Promise<void> {
    const { store, checkpoints, clock } = this.deps
    const generation = store.generationOf(row.id)
    try {
      const manifest = await checkpoints.save(row.id, agent, generation)
      store.note(
        row,
        'memory_paused',
        iso(clock.now()),
        `checkpoint of ${manifest.bytes} bytes in ${manifest.checkpointMs} ms at generation ${generation}`,
      )
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error)
      this.deps.logger.warn({ err: error, sessionId: row.id }, 'memory checkpoint failed; the sandbox stops')
      store.note(row, 'memory_discarded', iso(clock.now()), `memory checkpoint failed, stopped: ${message}`)
      await this.deps.runtime.stopAgent(agent)
    }
  }

  /** The session's agent: restored from its checkpoint when there is a usable one, else cold. */
  async start(
    row: Pick<SessionRow, 'id' | 'status'>,
    launch: AgentLaunch,
  ): Promise<{ agent: AgentProcess; restored: boolean }> {
    const { store, checkpoints, clock, runtime } = this.deps
    const started = await startFromCheckpoint(checkpoints, (l) => runtime.startAgent(l), launch, {
      generation: store.generationOf(row.id),
      driver: runtime.driverFor(launch.isolation).name,
    })
    if (started.resumed) store.note(row, 'memory_restored', iso(clock.now()), started.agent.sandboxId)
    else if (started.coldReason) store.note(row, 'memory_discarded', iso(clock.now()), started.coldReason)
    return { agent: started.agent, restored: started.resumed }
  }

  /** Bytes the session's checkpoint holds on disk (0 without one). */
  bytes(sessionId: string): Promise<number> {
    return this.deps.checkpoints.bytes(sessionId)
  }

  /** Deletes the session's checkpoint (the session is deleted, or its workspace went). */
  discard(sessionId: string): Promise<void> {
    return this.deps.checkpoints.discard(sessionId)
  }
}
