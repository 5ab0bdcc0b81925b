import { CairnProblem } from '@cairn/protocol'
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

/**
 * What outlives a session: the agent's memory (versioned text, mounted read-only at /memory in
 * every new sandbox). Promoted artifacts are the ArtifactStore's.
 */
export class MemoryService {
  constructor(
    private readonly deps: {
      db: Db
      /** Reads the proposed memory and artifacts from workspaces; mounts memory in sandboxes. */
      runtime: Pick<RuntimePort, 'openFile' | 'hasPath' | 'publishMemory'>
      clock: Clock
      logger: Logger
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
}
