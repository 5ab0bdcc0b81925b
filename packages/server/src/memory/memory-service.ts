import { createHash } from 'node:crypto'
import { createWriteStream, existsSync } from 'node:fs'
import { mkdir, readFile, rm, statfs } from 'node:fs/promises'
import path from 'node:path'
import { Transform } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { CairnProblem, newId } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import { type Db, isUniqueViolation } from '../db/database.js'

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

  async get(agentId: string): Promise<AgentMemory> {
    const row = await this.deps.db.q
      .selectFrom('agent_memory')
      .select(['version', 'content', 'source', 'created_at'])
      .where('agent_id', '=', agentId)
      .orderBy('version', 'desc')
      .limit(1)
      .executeTakeFirst()
    return row
      ? { agentId, version: row.version, content: row.content, source: row.source, updatedAt: row.created_at }
      : { agentId, version: 0, content: '', source: 'none', updatedAt: null }
  }

  /**
   * A new version; `baseVersion` (optional) must be the current one, or the write is refused. Two
   * writers racing for one version (in this process or another replica): the primary key takes
   * one, the other is refused as a `conflict`.
   */
  async put(agentId: string, content: string, source: string, baseVersion?: number): Promise<AgentMemory> {
    if (Buffer.byteLength(content) > MAX_MEMORY_BYTES) {
      throw new CairnProblem('payload_too_large', `agent memory is limited to ${MAX_MEMORY_BYTES} bytes`)
    }
    const current = await this.get(agentId)
    if (baseVersion !== undefined && baseVersion !== current.version) {
      throw new CairnProblem('conflict', `memory is at version ${current.version}, not ${baseVersion}`, {
        version: current.version,
      })
    }
    try {
      await this.deps.db.q
        .insertInto('agent_memory')
        .values({
          agent_id: agentId,
          version: current.version + 1,
          content,
          source,
          created_at: iso(this.deps.clock.now()),
        })
        .execute()
    } catch (error) {
      if (!isUniqueViolation(error)) throw error
      const now = await this.get(agentId)
      throw new CairnProblem('conflict', `memory moved to version ${now.version} meanwhile`, {
        version: now.version,
      })
    }
    return this.get(agentId)
  }

  /**
   * Hands the current memory to the runtime, to be mounted read-only at /memory in the agent's
   * sandboxes; returns the agent ID a start spec names it by.
   */
  async publish(agentId: string): Promise<string> {
    const memory = await this.get(agentId)
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
    if (content === (await this.get(agentId)).content) return undefined
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
    // A replica other than this one serves the download: with a shared database the bytes are
    // stored in it too (on SQLite the file in the data dir is the only copy).
    const shared = this.deps.db.dialect === 'postgres' ? await readFile(target) : undefined
    await this.deps.db.transaction(async () => {
      await this.deps.db.q
        .insertInto('artifacts')
        .values({
          id: info.id,
          tenant_id: row.tenantId,
          agent_id: info.agentId,
          session_id: info.sessionId,
          path: info.path,
          size_bytes: info.sizeBytes,
          sha256: info.sha256,
          created_at: info.createdAt,
        })
        .execute()
      if (shared)
        await this.deps.db.q
          .insertInto('artifact_blobs')
          .values({ artifact_id: info.id, content: shared })
          .execute()
    })
    return info
  }

  /** Bytes the tenant may still add to the artifact store (see `artifactLimits`). */
  private async artifactRoom(tenantId: string, dir: string): Promise<number> {
    const limits = this.deps.artifactLimits
    if (!limits) return Number.POSITIVE_INFINITY
    const disk = await statfs(dir)
    let room = disk.bavail * disk.bsize - limits.reserveBytes
    if (limits.tenantBytes) {
      const row = await this.deps.db.q
        .selectFrom('artifacts')
        .select((eb) => eb.fn.sum<number | null>('size_bytes').as('bytes'))
        .where('tenant_id', '=', tenantId)
        .executeTakeFirst()
      const held = Number(row?.bytes ?? 0)
      room = Math.min(room, limits.tenantBytes - held)
    }
    return Math.max(0, room)
  }

  async artifacts(agentId: string): Promise<ArtifactInfo[]> {
    const rows = await this.deps.db.q
      .selectFrom('artifacts')
      .selectAll()
      .where('agent_id', '=', agentId)
      .orderBy('created_at')
      .orderBy('id')
      .execute()
    return rows.map((r) => ({
      id: r.id,
      agentId: r.agent_id,
      sessionId: r.session_id,
      path: r.path,
      sizeBytes: r.size_bytes,
      sha256: r.sha256,
      createdAt: r.created_at,
    }))
  }

  async artifactFile(agentId: string, id: string): Promise<{ file: string; info: ArtifactInfo }> {
    const info = (await this.artifacts(agentId)).find((a) => a.id === id)
    if (!info) throw new CairnProblem('not_found', `No artifact ${id}`)
    return { file: path.join(this.deps.artifactRoot, agentId, id), info }
  }

  async readArtifact(agentId: string, id: string): Promise<Buffer> {
    const { file } = await this.artifactFile(agentId, id)
    if (existsSync(file) || this.deps.db.dialect !== 'postgres') return readFile(file)
    // Saved through another replica: its bytes are in the database.
    const row = await this.deps.db.q
      .selectFrom('artifact_blobs')
      .select('content')
      .where('artifact_id', '=', id)
      .executeTakeFirst()
    if (!row) throw new CairnProblem('not_found', `the bytes of artifact ${id} are gone`)
    return row.content
  }
}

function artifactQuotaProblem(rel: string, bytes: number, allowedBytes: number): CairnProblem {
  return new CairnProblem(
    'quota_exceeded',
    `/workspace/${rel} (${bytes} bytes or more) does not fit in the artifact store: ${allowedBytes} bytes left under the tenant's storage quota and the data disk's reserve`,
    { allowedBytes },
  )
}
