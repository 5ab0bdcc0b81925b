import { cp, mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import * as tar from 'tar'
import type { AgentProcess } from '../agent/agent-process.js'
import type { AgentLaunch, AgentMemoryState } from '../agent/types.js'
import { directoryBytes } from './gvisor-checkpoint.js'

/** What a session's memory checkpoint was taken with, beside its image (`manifest.json`). */
export interface CheckpointManifest {
  sessionId: string
  /** Whose quota it counts against (older checkpoints have none). */
  tenantId?: string | undefined
  /** Set on a fork's checkpoint: the snapshot whose memory it is (`POST …/snapshots {memory: true}`). */
  fromSnapshotId?: string | undefined
  /** The sandbox driver that wrote the image; only it can restore it. */
  driver: string
  /** The workspace generation when it was taken: a restore, import or fork since discards it. */
  generation: number
  state: AgentMemoryState
  /** Bytes on disk (image and manifest). */
  bytes: number
  /** How long the checkpoint took, the sandbox stopped meanwhile. */
  checkpointMs: number
  createdAt: string
}

/** What the next start of a session finds. */
export type Resumption =
  | { kind: 'resume'; imageDir: string; manifest: CheckpointManifest }
  | { kind: 'none' }
  /** There was one, and it cannot be used: it is deleted and the session starts cold. */
  | { kind: 'discarded'; reason: string }

const MANIFEST = 'manifest.json'

/**
 * The memory checkpoints of paused sessions (`pause: memory`), one directory per session under
 * `root`: the driver's image and a manifest. At most one per session; it is used once (a restored
 * sandbox goes on from it, so it is deleted once restored) and survives a server restart.
 */
export class MemoryCheckpoints {
  constructor(readonly root: string) {}

  dir(sessionId: string): string {
    if (!/^[a-z]+_[0-9a-zA-Z]+$/.test(sessionId)) throw new Error(`not a session id: ${sessionId}`)
    return path.join(this.root, sessionId)
  }

  /**
   * Checkpoints the agent's sandbox (which stops it) and records the manifest; the image is only
   * where `find` looks once complete, so a crash or failure midway leaves nothing to restore.
   */
  async save(
    sessionId: string,
    agent: AgentProcess,
    generation: number,
    tenantId?: string,
  ): Promise<CheckpointManifest> {
    const dir = this.dir(sessionId)
    const partial = `${dir}.partial`
    await rm(partial, { recursive: true, force: true })
    await mkdir(this.root, { recursive: true, mode: 0o700 })
    const started = performance.now()
    try {
      const { state } = await agent.checkpoint(partial)
      const manifest: CheckpointManifest = {
        sessionId,
        tenantId,
        driver: agent.isolation,
        generation,
        state,
        bytes: 0,
        checkpointMs: Math.round(performance.now() - started),
        createdAt: new Date().toISOString(),
      }
      await writeFile(path.join(partial, MANIFEST), JSON.stringify(manifest), { mode: 0o600 })
      manifest.bytes = await directoryBytes(partial)
      await writeFile(path.join(partial, MANIFEST), JSON.stringify(manifest), { mode: 0o600 })
      await rm(dir, { recursive: true, force: true })
      await rename(partial, dir)
      return manifest
    } catch (error) {
      await rm(partial, { recursive: true, force: true })
      throw error
    }
  }

  /**
   * The session's checkpoint if it can be restored here: taken by `driver` at workspace
   * `generation`. One that cannot (the workspace changed since, another driver, an unreadable
   * manifest) is deleted, and why is returned for the session's events.
   */
  async find(sessionId: string, generation: number, driver: string): Promise<Resumption> {
    const manifest = await this.manifest(sessionId)
    if (manifest === undefined) return { kind: 'none' }
    const reason =
      manifest === 'unreadable'
        ? 'its manifest is unreadable'
        : manifest.generation !== generation
          ? `the workspace changed since it was taken (generation ${manifest.generation}, now ${generation}: a restore, an import or a fork)`
          : manifest.driver !== driver
            ? `it was taken under ${manifest.driver} and the agent now runs under ${driver}`
            : undefined
    if (reason || manifest === 'unreadable') {
      await this.discard(sessionId)
      return { kind: 'discarded', reason: `memory checkpoint discarded: ${reason}` }
    }
    return { kind: 'resume', imageDir: this.dir(sessionId), manifest }
  }

  /**
   * Copies the checkpoint kept as `fromId` into `to` as `toId`, its manifest changed by `patch`
   * (a snapshot's memory from its session's checkpoint, a fork's from its snapshot's). False: there
   * is none (or it is unreadable).
   */
  async copyTo(
    fromId: string,
    to: MemoryCheckpoints,
    toId: string,
    patch: Partial<CheckpointManifest>,
  ): Promise<CheckpointManifest | undefined> {
    const manifest = await this.manifest(fromId)
    if (typeof manifest !== 'object') return undefined
    const dir = to.dir(toId)
    const partial = `${dir}.partial`
    await rm(partial, { recursive: true, force: true })
    await mkdir(to.root, { recursive: true, mode: 0o700 })
    try {
      await cp(this.dir(fromId), partial, { recursive: true })
      const copied = { ...manifest, ...patch }
      await writeFile(path.join(partial, MANIFEST), JSON.stringify(copied), { mode: 0o600 })
      await rm(dir, { recursive: true, force: true })
      await rename(partial, dir)
      return copied
    } catch (error) {
      await rm(partial, { recursive: true, force: true })
      throw error
    }
  }

  /**
   * The session's checkpoint if one is kept at workspace `generation` (what its next start would
   * restore); nothing is deleted, unlike `find`.
   */
  async current(sessionId: string, generation: number): Promise<CheckpointManifest | undefined> {
    const manifest = await this.manifest(sessionId)
    return typeof manifest === 'object' && manifest.generation === generation ? manifest : undefined
  }

  /**
   * The session's checkpoint (image and manifest) as a tar archive, for another node; undefined
   * without a readable one.
   */
  async pack(sessionId: string): Promise<Buffer | undefined> {
    if (typeof (await this.manifest(sessionId)) !== 'object') return undefined
    const dir = this.dir(sessionId)
    const chunks: Buffer[] = []
    for await (const chunk of tar.c({ cwd: dir, portable: true }, await readdir(dir)))
      chunks.push(Buffer.from(chunk as Uint8Array))
    return Buffer.concat(chunks)
  }

  /**
   * Keeps a checkpoint packed by `pack` (on another node) as the session's, its manifest changed
   * by `patch`; written aside and renamed once complete, as `save` does.
   */
  async unpack(sessionId: string, archive: Buffer, patch: Partial<CheckpointManifest>): Promise<void> {
    const dir = this.dir(sessionId)
    const partial = `${dir}.partial`
    await rm(partial, { recursive: true, force: true })
    await mkdir(partial, { recursive: true, mode: 0o700 })
    try {
      // Only plain files at the top: an image and its manifest.
      await pipeline(
        Readable.from([archive]),
        tar.x({
          cwd: partial,
          filter: (entry) => !entry.includes('/') && !entry.includes('..'),
          strict: true,
        }),
      )
      const manifest = JSON.parse(await readFile(path.join(partial, MANIFEST), 'utf8')) as CheckpointManifest
      await writeFile(path.join(partial, MANIFEST), JSON.stringify({ ...manifest, ...patch }), {
        mode: 0o600,
      })
      await rm(dir, { recursive: true, force: true })
      await rename(partial, dir)
    } catch (error) {
      await rm(partial, { recursive: true, force: true })
      throw error
    }
  }

  /** Bytes the session's checkpoint holds (0 without one), for usage and quotas. */
  async bytes(sessionId: string): Promise<number> {
    const manifest = await this.manifest(sessionId)
    return typeof manifest === 'object' ? manifest.bytes : 0
  }

  /** Bytes the tenant's checkpoints hold, but for `exceptSessionId`'s (its quota's share). */
  async tenantBytes(tenantId: string, exceptSessionId: string): Promise<number> {
    let total = 0
    for (const entry of await readdir(this.root, { withFileTypes: true }).catch(() => [])) {
      if (!entry.isDirectory() || entry.name.endsWith('.partial') || entry.name === exceptSessionId) continue
      const manifest = await this.manifest(entry.name).catch(() => undefined)
      if (typeof manifest === 'object' && manifest.tenantId === tenantId) total += manifest.bytes
    }
    return total
  }

  /**
   * Deletes the checkpoints taken before `cutoff` (retention: a paused session's memory does not
   * stay on disk forever) and says whose, with the bytes freed. An unreadable one goes too.
   */
  async expire(cutoff: Date): Promise<{ sessionId: string; bytes: number }[]> {
    const entries = await readdir(this.root, { withFileTypes: true }).catch(() => [])
    const expired: { sessionId: string; bytes: number }[] = []
    for (const entry of entries) {
      if (!entry.isDirectory() || entry.name.endsWith('.partial')) continue
      const manifest = await this.manifest(entry.name)
      if (manifest === undefined) continue
      if (manifest !== 'unreadable' && Date.parse(manifest.createdAt) >= cutoff.getTime()) continue
      await this.discard(entry.name)
      expired.push({ sessionId: entry.name, bytes: manifest === 'unreadable' ? 0 : manifest.bytes })
    }
    return expired
  }

  async discard(sessionId: string): Promise<void> {
    await rm(this.dir(sessionId), { recursive: true, force: true })
  }

  private async manifest(sessionId: string): Promise<CheckpointManifest | 'unreadable' | undefined> {
    let text: string
    try {
      text = await readFile(path.join(this.dir(sessionId), MANIFEST), 'utf8')
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
      return 'unreadable'
    }
    try {
      const parsed = JSON.parse(text) as CheckpointManifest
      return typeof parsed.generation === 'number' && typeof parsed.state?.protocol === 'object'
        ? parsed
        : 'unreadable'
    } catch {
      return 'unreadable'
    }
  }
}

/** How a session's agent came up: restored from its checkpoint, or cold (and why, if one was there). */
export interface ResumedStart {
  agent: AgentProcess
  resumed: boolean
  /** The snapshot whose memory it was restored from (a fork of a memory snapshot). */
  fromSnapshotId?: string | undefined
  /** Why a checkpoint there was not used (discarded, or its restore failed): for the session's events. */
  coldReason?: string | undefined
}

/**
 * Starts a session's agent from its memory checkpoint when there is a usable one, else cold. A
 * restore that fails falls back to a cold start with the reason, never a broken session; either
 * way the checkpoint is gone afterwards (a restored sandbox has moved on from it).
 */
export async function startFromCheckpoint(
  checkpoints: MemoryCheckpoints,
  start: (launch: AgentLaunch) => Promise<AgentProcess>,
  launch: AgentLaunch,
  context: {
    generation: number
    driver: string
    /** A sandbox booted ahead for this restore (`AgentResume.targetId`). */
    targetId?: string | undefined
  },
): Promise<ResumedStart> {
  const found = await checkpoints.find(launch.sessionId, context.generation, context.driver)
  if (found.kind === 'none') return { agent: await start(launch), resumed: false }
  if (found.kind === 'discarded')
    return { agent: await start(launch), resumed: false, coldReason: found.reason }
  try {
    const agent = await start({
      ...launch,
      resume: { imageDir: found.imageDir, state: found.manifest.state, targetId: context.targetId },
    })
    await checkpoints.discard(launch.sessionId)
    return { agent, resumed: true, fromSnapshotId: found.manifest.fromSnapshotId }
  } catch (error) {
    await checkpoints.discard(launch.sessionId)
    const why = error instanceof Error ? error.message : String(error)
    return {
      agent: await start(launch),
      resumed: false,
      coldReason: `memory checkpoint restore failed, started cold: ${why}`,
    }
  }
}
