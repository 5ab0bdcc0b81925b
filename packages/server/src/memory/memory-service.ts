import { createHash } from 'node:crypto'
import { createWriteStream } from 'node:fs'
import { mkdir, readFile, rm, statfs } from 'node:fs/promises'
import path from 'node:path'
import { Transform } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { CairnProblem, newId } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'

export const MAX_MEMORY_BYTES = 256 * 1024
export const PROPOSED_MEMORY_PATH = '.cairn/memory.proposed.md'

export interface AgentMemory {
  agentId: string
  version: number
  content: string
  source: string
  updatedAt: string | null
}

export interface ArtifactInfo {
  id: string
  agentId: string
  sessionId: string
  path: string
  sizeBytes: number
  sha256: string
  createdAt: string
}

/**
 * What outlives a session: the agent's memory (versioned text, mounted read-only at /memory in
 * every new sandbox) and promoted artifacts (files copied out of a workspace).
 */
export class MemoryService {
  constructor(
    private readonly deps: {
      db: Db
      /** Reads the proposed memory and artifacts from workspaces; mounts memory in sandboxes. */
      runtime: Pick<RuntimePort, 'openFile' | 'hasPath' | 'publishMemory'>
      clock: Clock
      logger: Logger
      /** Host directory for artifact bytes (under the data dir). */
      artifactRoot: string
      /**
       * Artifacts live on the data dir's disk, beside the database: a tenant's artifacts together
       * stay within `tenantBytes` (unset: no limit), and a copy never brings that disk's free space
       * below `reserveBytes`, so no tenant can starve Cairn's own data.
       */
      artifactLimits?: { tenantBytes?: number | undefined; reserveBytes: number } | undefined
    },
  ) {}

  get(agentId: string): AgentMemory {
    const row = this.deps.db
      .prepare<[string], { version: number; content: string; source: string; created_at: string }>(
        'SELECT version, content, source, created_at FROM agent_memory WHERE agent_id = ? ORDER BY version DESC LIMIT 1',
      )
      .get(agentId)
    return row
      ? { agentId, version: row.version, content: row.content, source: row.source, updatedAt: row.created_at }
      : { agentId, version: 0, content: '', source: 'none', updatedAt: null }
  }

  /** A new version; `baseVersion` (optional) must be the current one, or the write is refused. */
  put(agentId: string, content: string, source: string, baseVersion?: number): AgentMemory {
    if (Buffer.byteLength(content) > MAX_MEMORY_BYTES) {
      throw new CairnProblem('payload_too_large', `agent memory is limited to ${MAX_MEMORY_BYTES} bytes`)
    }
    const current = this.get(agentId)
    if (baseVersion !== undefined && baseVersion !== current.version) {
      throw new CairnProblem('conflict', `memory is at version ${current.version}, not ${baseVersion}`, {
        version: current.version,
      })
    }
    this.deps.db
      .prepare(
        'INSERT INTO agent_memory (agent_id, version, content, source, created_at) VALUES (?, ?, ?, ?, ?)',
      )
      .run(agentId, current.version + 1, content, source, iso(this.deps.clock.now()))
    return this.get(agentId)
  }

  /**
   * Hands the current memory to the runtime, to be mounted read-only at /memory in the agent's
   * sandboxes; returns the agent ID a start spec names it by.
   */
  async publish(agentId: string): Promise<string> {
    const memory = this.get(agentId)
    await this.deps.runtime.publishMemory(agentId, memory.version, memory.content)
    return agentId
  }

  /** Promotes `/workspace/.cairn/memory.proposed.md` when it differs from the current memory. */
  async promoteProposed(
    agentId: string,
    sessionId: string,
    source: string,
  ): Promise<AgentMemory | undefined> {
    // Asked after every turn: a stat, not a reader process, when nothing is proposed.
    if (!(await this.deps.runtime.hasPath({ sessionId }, PROPOSED_MEMORY_PATH))) return undefined
    // Read by the runtime's workspace reader: no link at any component is followed, only a
    // regular file opened. Gone meanwhile: nothing is proposed.
    const file = await this.deps.runtime
      .openFile({ sessionId }, Buffer.from(PROPOSED_MEMORY_PATH))
      .catch((error: unknown) => {
        if (error instanceof CairnProblem && error.code === 'not_found') return undefined
        throw error
      })
    if (!file) return undefined
    if (file.size > MAX_MEMORY_BYTES) {
      file.stream.destroy()
      throw new CairnProblem('payload_too_large', `proposed memory is larger than ${MAX_MEMORY_BYTES} bytes`)
    }
    const chunks: Buffer[] = []
    for await (const chunk of file.stream) chunks.push(chunk as Buffer)
    const content = Buffer.concat(chunks).toString('utf8')
    if (content === this.get(agentId).content) return undefined
    return this.put(agentId, content, source)
  }

  async saveArtifact(
    row: { tenantId: string; agentId: string; sessionId: string },
    rel: string,
  ): Promise<ArtifactInfo> {
    const file = await this.deps.runtime.openFile({ sessionId: row.sessionId }, Buffer.from(rel))
    const id = newId('artifact')
    const dir = path.join(this.deps.artifactRoot, row.agentId)
    await mkdir(dir, { recursive: true, mode: 0o700 })
    const target = path.join(dir, id)
    const hash = createHash('sha256')
    let size = 0
    const allowedBytes = await this.artifactRoom(row.tenantId, dir)
    if (file.size > allowedBytes) {
      file.stream.destroy()
      throw artifactQuotaProblem(rel, file.size, allowedBytes)
    }
    // The file may still grow while it is copied: the room is checked on every chunk too.
    const counted = new Transform({
      transform(chunk: Buffer, _encoding, done) {
        size += chunk.length
        if (size > allowedBytes) return done(artifactQuotaProblem(rel, size, allowedBytes))
        hash.update(chunk)
        done(null, chunk)
      },
    })
    await pipeline(file.stream, counted, createWriteStream(target, { mode: 0o600 })).catch(
      async (error: unknown) => {
        await rm(target, { force: true })
        throw error
      },
    )
    const info: ArtifactInfo = {
      id,
      agentId: row.agentId,
      sessionId: row.sessionId,
      path: `/workspace/${rel}`,
      sizeBytes: size,
      sha256: hash.digest('hex'),
      createdAt: iso(this.deps.clock.now()),
    }
    this.deps.db
      .prepare(
        'INSERT INTO artifacts (id, tenant_id, agent_id, session_id, path, size_bytes, sha256, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
      )
      .run(
        info.id,
        row.tenantId,
        info.agentId,
        info.sessionId,
        info.path,
        info.sizeBytes,
        info.sha256,
        info.createdAt,
      )
    return info
  }

  /** Bytes the tenant may still add to the artifact store (see `artifactLimits`). */
  private async artifactRoom(tenantId: string, dir: string): Promise<number> {
    const limits = this.deps.artifactLimits
    if (!limits) return Number.POSITIVE_INFINITY
    const disk = await statfs(dir)
    let room = disk.bavail * disk.bsize - limits.reserveBytes
    if (limits.tenantBytes) {
      const held =
        this.deps.db
          .prepare<[string], { bytes: number | null }>(
            'SELECT SUM(size_bytes) AS bytes FROM artifacts WHERE tenant_id = ?',
          )
          .get(tenantId)?.bytes ?? 0
      room = Math.min(room, limits.tenantBytes - held)
    }
    return Math.max(0, room)
  }

  artifacts(agentId: string): ArtifactInfo[] {
    return this.deps.db
      .prepare<
        [string],
        {
          id: string
          agent_id: string
          session_id: string
          path: string
          size_bytes: number
          sha256: string
          created_at: string
        }
      >('SELECT * FROM artifacts WHERE agent_id = ? ORDER BY created_at, id')
      .all(agentId)
      .map((r) => ({
        id: r.id,
        agentId: r.agent_id,
        sessionId: r.session_id,
        path: r.path,
        sizeBytes: r.size_bytes,
        sha256: r.sha256,
        createdAt: r.created_at,
      }))
  }

  artifactFile(agentId: string, id: string): { file: string; info: ArtifactInfo } {
    const info = this.artifacts(agentId).find((a) => a.id === id)
    if (!info) throw new CairnProblem('not_found', `No artifact ${id}`)
    return { file: path.join(this.deps.artifactRoot, agentId, id), info }
  }

  async readArtifact(agentId: string, id: string): Promise<Buffer> {
    return readFile(this.artifactFile(agentId, id).file)
  }
}

function artifactQuotaProblem(rel: string, bytes: number, allowedBytes: number): CairnProblem {
  return new CairnProblem(
    'quota_exceeded',
    `/workspace/${rel} (${bytes} bytes or more) does not fit in the artifact store: ${allowedBytes} bytes left under the tenant's storage quota and the data disk's reserve`,
    { allowedBytes },
  )
}
