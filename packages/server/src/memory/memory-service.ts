import { createHash } from 'node:crypto'
import { createWriteStream, existsSync } from 'node:fs'
import { chmod, mkdir, readFile, rename, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { pipeline } from 'node:stream/promises'
import { CairnProblem, newId } from '@cairn/protocol'
import type { SandboxBind } from '@cairn/runtime'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import { openInside } from '../files/confine.js'

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
  /** Memory version last written to each agent's mount directory. */
  private readonly written = new Map<string, number>()

  constructor(
    private readonly deps: {
      db: Db
      clock: Clock
      /** Host directory sandboxes can reach (under the runtime dir): memory files are written here. */
      mountRoot: string
      logger: Logger
      /** Host directory for artifact bytes (under the data dir). */
      artifactRoot: string
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

  /** Writes the current memory where a sandbox can mount it and returns the read-only bind. */
  async bind(agentId: string): Promise<SandboxBind> {
    const dir = path.join(this.deps.mountRoot, agentId)
    await mkdir(dir, { recursive: true })
    await chmod(this.deps.mountRoot, 0o711)
    await chmod(dir, 0o755)
    const memory = this.get(agentId)
    // Many sandboxes of one agent start at once: write only when the version changed, through a
    // temporary file of this call's own, so a reader never sees a half-written file.
    if (this.written.get(agentId) !== memory.version || !existsSync(path.join(dir, 'MEMORY.md'))) {
      const tmp = path.join(dir, `.MEMORY.${newId('sandbox')}.tmp`)
      await writeFile(tmp, memory.content, { mode: 0o644 })
      await rename(tmp, path.join(dir, 'MEMORY.md'))
      const versionTmp = path.join(dir, `.VERSION.${newId('sandbox')}.tmp`)
      await writeFile(versionTmp, `${memory.version}\n`, { mode: 0o644 })
      await rename(versionTmp, path.join(dir, 'VERSION'))
      this.written.set(agentId, memory.version)
    }
    return { source: dir, dest: '/memory', readOnly: true }
  }

  /** Promotes `/workspace/.cairn/memory.proposed.md` when it differs from the current memory. */
  async promoteProposed(
    agentId: string,
    workspaceDir: string,
    source: string,
  ): Promise<AgentMemory | undefined> {
    if (!existsSync(path.join(workspaceDir, PROPOSED_MEMORY_PATH))) return undefined
    const handle = await openInside(workspaceDir, PROPOSED_MEMORY_PATH)
    let content: string
    try {
      const info = await handle.stat()
      if (!info.isFile())
        throw new CairnProblem(
          'validation_failed',
          `/workspace/${PROPOSED_MEMORY_PATH} is not a regular file`,
        )
      if (info.size > MAX_MEMORY_BYTES) {
        throw new CairnProblem(
          'payload_too_large',
          `proposed memory is larger than ${MAX_MEMORY_BYTES} bytes`,
        )
      }
      content = await handle.readFile('utf8')
    } finally {
      await handle.close()
    }
    if (content === this.get(agentId).content) return undefined
    return this.put(agentId, content, source)
  }

  async saveArtifact(
    row: { tenantId: string; agentId: string; sessionId: string },
    workspaceDir: string,
    rel: string,
  ): Promise<ArtifactInfo> {
    const handle = await openInside(workspaceDir, rel)
    const id = newId('artifact')
    const dir = path.join(this.deps.artifactRoot, row.agentId)
    await mkdir(dir, { recursive: true, mode: 0o700 })
    const target = path.join(dir, id)
    const hash = createHash('sha256')
    let size = 0
    try {
      if (!(await handle.stat()).isFile())
        throw new CairnProblem('validation_failed', `/workspace/${rel} is not a regular file`)
      const stream = handle.createReadStream()
      stream.on('data', (chunk: string | Buffer) => {
        hash.update(chunk)
        size += chunk.length
      })
      await pipeline(stream, createWriteStream(target, { mode: 0o600 }))
    } finally {
      // The copy's own error (if any) is the one to report; closing a read-only handle loses nothing.
      await handle
        .close()
        .catch((error: unknown) =>
          this.deps.logger.warn({ err: error, rel }, 'closing an artifact source failed'),
        )
    }
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
