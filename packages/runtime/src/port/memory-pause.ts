import { rm } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { AgentProcess } from '../agent/agent-process.js'
import type { AgentLaunch } from '../agent/types.js'
import { checkpointOverQuota } from '../checkpoint/checkpoint-quota.js'
import {
  MemoryCheckpoints,
  type ResumedStart,
  startFromCheckpoint,
} from '../checkpoint/memory-checkpoints.js'
import type { Runtime } from '../runtime.js'
import { isIsolationName, type SandboxDriver } from '../sandbox/driver.js'
import type { ResidentBounds } from './resident-bounds.js'
import { ResidentMarkers } from './resident-markers.js'
import type { PauseHooks } from './resident-pauses.js'
import type { AgentPause, ForkCheckpoint, PauseEvent } from './runtime-port.js'
import type { WarmPool } from './warm-pool.js'

/**
 * The memory of sandboxes (docs/architecture: `pause: memory`): a cooled sandbox checkpointed
 * instead of stopped and restored on its next start, a snapshot's memory (`memory: true`) kept
 * beside it and copied to its forks, each charged to the storage quotas.
 */
export class MemoryPause {
  /** `pause: memory` sessions' checkpoints, under the data dir (they outlive a restart). */
  private readonly checkpoints: MemoryCheckpoints
  /** The memory of snapshots taken with `memory: true`, by snapshot ID (forks restore copies). */
  private readonly snapshotMemory: MemoryCheckpoints
  /** The sandboxes booted ahead for paused sessions' next restore, by session (`prepareRestore`). */
  private readonly targets = new Map<string, RestoreTargetRef>()
  /** Sessions frozen in place, on disk: what a restart while frozen lost is named at the next start. */
  private readonly markers: ResidentMarkers

  constructor(
    private readonly runtime: Runtime,
    private readonly pool: WarmPool,
    private readonly pauseEvent: (sessionId: string, event: PauseEvent) => void,
  ) {
    this.checkpoints = new MemoryCheckpoints(path.join(runtime.options.dataDir, 'checkpoints'))
    this.snapshotMemory = new MemoryCheckpoints(path.join(runtime.options.dataDir, 'snapshot-checkpoints'))
    this.markers = new ResidentMarkers(path.join(runtime.options.dataDir, 'resident-pauses'))
  }

  /** Forgets the session's memory checkpoint (its sandbox starts cold next). */
  async discard(sessionId: string): Promise<void> {
    await this.dropTarget(sessionId)
    await this.checkpoints.discard(sessionId)
    this.markers.clear(sessionId)
  }

  /**
   * What pausing the session's agent does (`WarmPool.add`): frozen in place, recorded (and marked
   * on disk); released, a driver that checkpoints takes its checkpoint (`pause`), bwrap stops it
   * and its memory is gone, the release's reason in the session's events.
   */
  hooks(
    sessionId: string,
    tenantId: string,
    agent: AgentProcess,
    pause: AgentPause,
    bounds: ResidentBounds,
  ): PauseHooks {
    const then = agent.checkpointable
      ? 'then checkpointed to disk'
      : `which ends its memory: ${agent.isolation} keeps no checkpoint`
    return {
      resident: (change, ms) => {
        if (change === 'frozen') this.markers.mark(sessionId, agent.isolation, Date.now() - ms)
        else this.markers.clear(sessionId)
        if (change === 'dropped') return
        this.pauseEvent(
          sessionId,
          change === 'frozen'
            ? {
                cause: 'memory_paused',
                detail: `resident: frozen in place in ${Math.round(ms)} ms, its memory kept in RAM; released after ${bounds.idleMs / 1000} s or to keep at most ${bounds.max} frozen, ${then}`,
              }
            : {
                cause: 'memory_restored',
                detail: `resident: thawed in place after ${Math.round(ms)} ms frozen`,
              },
        )
      },
      release: async (why, shutdown) => {
        if (agent.checkpointable) {
          await this.pause(sessionId, tenantId, agent, pause, why)
          this.markers.clear(sessionId)
          return
        }
        await this.runtime.stopAgent(agent)
        // A release at shutdown leaves the marker: the next message names the loss (`start`).
        if (shutdown) return
        this.markers.clear(sessionId)
        this.pauseEvent(sessionId, {
          cause: 'memory_discarded',
          detail: `memory released, its sandbox stopped: ${why}; ${agent.isolation} keeps no checkpoint, so the next message starts cold`,
        })
      },
    }
  }

  /** Destroys the sandbox booted for the session's next restore, if it is still there. */
  private async dropTarget(sessionId: string): Promise<void> {
    const target = this.targets.get(sessionId)
    this.targets.delete(sessionId)
    if (target) await dropUnused(target)
  }

  /**
   * Boots the sandbox the paused session's next restore loads its image into, so that restore
   * need not boot one; where it cannot, the restore boots its sandbox as it would without.
   */
  private async prepareTarget(sessionId: string, agent: AgentProcess): Promise<void> {
    await this.dropTarget(sessionId)
    const booted = await agent.prepareRestoreTarget().catch((error: unknown) => {
      this.runtime.logger.warn({ err: error, sessionId }, 'no restore target booted; the restore will boot')
      return undefined
    })
    if (booted && isIsolationName(agent.isolation))
      this.targets.set(sessionId, { ...booted, driver: this.runtime.driverFor(agent.isolation) })
  }

  /** Forgets a snapshot's memory. */
  discardSnapshot(snapshotId: string): Promise<void> {
    return this.snapshotMemory.discard(snapshotId)
  }

  /**
   * Starts a `pause: memory` session's sandbox from its checkpoint when one is there at the
   * workspace's `generation` (cold otherwise), saying which happened.
   */
  async start(
    sessionId: string,
    launch: AgentLaunch,
    generation: number,
    driver: SandboxDriver,
  ): Promise<ResumedStart> {
    const lost = await this.markers.lost(sessionId)
    if (!driver.capabilities.memorySnapshot) {
      // Resident pauses only (bwrap): nothing on disk to restore; a restart while frozen is named.
      const agent = await this.runtime.startAgent(launch)
      if (lost) this.pauseEvent(sessionId, { cause: 'memory_discarded', detail: lost })
      return { agent, resumed: false, coldReason: lost }
    }
    const started = await this.restoreOrStart(sessionId, launch, generation, driver.name)
    const coldReason = started.coldReason ?? (started.resumed ? undefined : lost)
    if (started.resumed)
      this.pauseEvent(sessionId, {
        cause: 'memory_restored',
        detail: started.fromSnapshotId
          ? `restored from the memory of snapshot ${started.fromSnapshotId} into ${started.agent.sandboxId}`
          : started.agent.sandboxId,
      })
    else if (coldReason) this.pauseEvent(sessionId, { cause: 'memory_discarded', detail: coldReason })
    return { ...started, coldReason }
  }

  private async restoreOrStart(
    sessionId: string,
    launch: AgentLaunch,
    generation: number,
    driver: string,
  ): Promise<ResumedStart> {
    const target = this.targets.get(sessionId)
    this.targets.delete(sessionId)
    const started = await startFromCheckpoint(
      this.checkpoints,
      (l) => this.runtime.startAgent(l),
      { ...launch, checkpointable: true },
      { generation, driver, targetId: target?.sandboxId },
    )
    // Not restored into, nor its id taken by a restore that booted (no checkpoint, a cold start): it goes.
    if (target && started.agent.sandboxId !== target.sandboxId) await dropUnused(target)
    return started
  }

  /**
   * Checkpoints a cooled `pause: memory` agent (which stops it) at the workspace's generation now
   * (its marker); one that fails, or that would not fit in the session's storage quota, leaves the
   * session as a stop would, with the reason.
   */
  async pause(
    sessionId: string,
    tenantId: string,
    agent: AgentProcess,
    pause: { generation: number },
    /** Why it is checkpointed now (a resident pause's release), said in the event. */
    why?: string,
  ): Promise<void> {
    try {
      const [generation] = await this.runtime.pool.readGenerations([sessionId])
      const manifest = await this.checkpoints.save(sessionId, agent, generation ?? pause.generation, tenantId)
      const overQuota = await checkpointOverQuota(
        this.runtime.pool,
        [this.checkpoints, this.snapshotMemory],
        tenantId,
        manifest.bytes,
        {
          sessionId,
          except: sessionId,
        },
      )
      if (overQuota) {
        await this.checkpoints.discard(sessionId)
        this.pauseEvent(sessionId, {
          cause: 'memory_discarded',
          detail: `memory checkpoint not kept, stopped: quota_exceeded: ${overQuota}`,
        })
        return
      }
      // Part of the pause, so a start that waits for the pause finds the target ready.
      await this.prepareTarget(sessionId, agent)
      this.pauseEvent(sessionId, {
        cause: 'memory_paused',
        detail: `checkpoint of ${manifest.bytes} bytes in ${manifest.checkpointMs} ms at generation ${manifest.generation}${why ? ` (${why})` : ''}`,
      })
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error)
      this.pauseEvent(sessionId, {
        cause: 'memory_discarded',
        detail: `memory checkpoint failed, stopped: ${message}`,
      })
      await this.runtime.stopAgent(agent)
    }
  }

  /** See `RuntimePort.checkpointForSnapshot` (the caller counts the session as in use). */
  async checkpointWarm(
    sessionId: string,
    snapshotId: string,
  ): Promise<{ bytes: number; checkpointMs: number }> {
    const taken = await this.checkpointRunning(sessionId)
    await this.copySnapshotMemory(sessionId, snapshotId, taken.tenantId, taken.bytes)
    return { bytes: taken.bytes, checkpointMs: taken.checkpointMs }
  }

  /** See `RuntimePort.checkpointForFork` (the caller counts the session as in use). */
  async checkpointForFork(sessionId: string): Promise<ForkCheckpoint> {
    // A keep-warm window that ended just now may be checkpointing the sandbox: its image is the one.
    // One frozen in place (a resident pause) is thawed to be checkpointed as a warm one.
    this.pool.wake(sessionId)
    await this.pool.settled(sessionId)
    if (this.pool.agent(sessionId)?.alive) {
      const { bytes, checkpointMs } = await this.checkpointRunning(sessionId)
      return { bytes, checkpointMs, wasPaused: false }
    }
    const [generation] = await this.runtime.pool.readGenerations([sessionId])
    const kept = await this.checkpoints.current(sessionId, generation ?? 0)
    if (!kept)
      throw new CairnProblem(
        'sandbox_not_running',
        `session ${sessionId} has no running sandbox and no memory checkpoint of its workspace as it is: a fork with memory starts from a running or paused sandbox (send it a message first)`,
      )
    return { bytes: kept.bytes, checkpointMs: kept.checkpointMs, wasPaused: true }
  }

  /** See `RuntimePort.keepSnapshotMemory` (the caller counts the session as in use). */
  async keepSnapshotMemory(sessionId: string, snapshotId: string, tenantId: string): Promise<void> {
    await this.copySnapshotMemory(sessionId, snapshotId, tenantId, await this.checkpoints.bytes(sessionId))
  }

  /**
   * Checkpoints the session's warm sandbox as its own `pause: memory` checkpoint, which stops it
   * (its next start restores it). `sandbox_not_running` without one; `bad_request` for a sandbox
   * not started to be checkpointed.
   */
  private async checkpointRunning(
    sessionId: string,
  ): Promise<{ bytes: number; checkpointMs: number; tenantId: string }> {
    this.pool.wake(sessionId)
    const warm = this.pool.agent(sessionId)
    if (!warm?.alive)
      throw new CairnProblem(
        'sandbox_not_running',
        `session ${sessionId} has no running sandbox: a snapshot with memory keeps a running sandbox's state (send it a message first)`,
      )
    if (!warm.checkpointable)
      throw new CairnProblem(
        'bad_request',
        `session ${sessionId}'s sandbox was not started to be checkpointed: only a pause: memory session's sandbox can be`,
      )
    const detached = this.pool.detach(sessionId)
    if (!detached)
      throw new CairnProblem('sandbox_not_running', `session ${sessionId} has no running sandbox`)
    const [generation] = await this.runtime.pool.readGenerations([sessionId])
    try {
      const manifest = await this.checkpoints.save(
        sessionId,
        detached.agent,
        generation ?? 0,
        detached.tenantId,
      )
      return { bytes: manifest.bytes, checkpointMs: manifest.checkpointMs, tenantId: detached.tenantId }
    } catch (error) {
      await this.runtime.stopAgent(detached.agent)
      throw error
    }
  }

  /** Copies the session's checkpoint as `snapshotId`'s memory; `quota_exceeded` keeps none. */
  private async copySnapshotMemory(
    sessionId: string,
    snapshotId: string,
    tenantId: string,
    bytes: number,
  ): Promise<void> {
    const copied = await this.checkpoints.copyTo(sessionId, this.snapshotMemory, snapshotId, {
      sessionId: snapshotId,
    })
    if (!copied)
      throw new CairnProblem('sandbox_not_running', `session ${sessionId} has no memory checkpoint to keep`)
    const overQuota = await checkpointOverQuota(
      this.runtime.pool,
      [this.checkpoints, this.snapshotMemory],
      tenantId,
      bytes,
      { except: snapshotId },
    )
    if (overQuota) {
      await this.snapshotMemory.discard(snapshotId)
      throw new CairnProblem('quota_exceeded', `the snapshot's memory was not kept: ${overQuota}`)
    }
  }

  /** See `RuntimePort.exportMemory`. */
  exportMemory(sessionId: string): Promise<Buffer | undefined> {
    return this.checkpoints.pack(sessionId)
  }

  /** See `RuntimePort.importMemory`. */
  importMemory(sessionId: string, archive: Buffer, generation: number): Promise<void> {
    return this.checkpoints.unpack(sessionId, archive, { sessionId, generation })
  }

  async fork(snapshotId: string, childId: string, generation: number): Promise<boolean> {
    const copied = await this.snapshotMemory.copyTo(snapshotId, this.checkpoints, childId, {
      sessionId: childId,
      generation,
      fromSnapshotId: snapshotId,
    })
    return copied !== undefined
  }

  bytes(sessionIds: readonly string[]): Promise<number[]> {
    return Promise.all(sessionIds.map((id) => this.checkpoints.bytes(id)))
  }

  expire(cutoff: Date): Promise<{ sessionId: string; bytes: number }[]> {
    return this.checkpoints.expire(cutoff)
  }
}

/** A sandbox booted for a paused session's next restore, and the run dir made for it. */
interface RestoreTargetRef {
  sandboxId: string
  runDir: string
  driver: SandboxDriver
}

/** Destroys a restore target no agent took, and its run dir. */
async function dropUnused(target: RestoreTargetRef): Promise<void> {
  await target.driver.dropRestoreTarget?.(target.sandboxId)
  await rm(target.runDir, { recursive: true, force: true })
}
