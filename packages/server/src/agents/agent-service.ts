import {
  type AgentDetail,
  type AgentInfo,
  CairnProblem,
  type DeployResult,
  newId,
  type RevisionInfo,
} from '@cairn/protocol'
import type { Runtime } from '@cairn/runtime'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import { type AgentRow, AgentStore, type StoredRevision } from './agent-store.js'
import { type ArchiveLimits, DEFAULT_ARCHIVE_LIMITS, extractArchive, inspectArchive } from './archive.js'
import { readManifest } from './manifest.js'

export interface AgentServiceDeps {
  db: Db
  runtime: Runtime
  clock: Clock
  logger: Logger
  archiveLimits?: ArchiveLimits
}

export function revisionInfo(revision: StoredRevision): RevisionInfo {
  const { manifest: _manifest, ...info } = revision
  return info
}

/** Deploys project archives as revisions and answers questions about agents. */
export class AgentService {
  readonly store: AgentStore

  constructor(private readonly deps: AgentServiceDeps) {
    this.store = new AgentStore(deps.db)
  }

  async deploy(tenantId: string, archive: Buffer, nameOverride?: string): Promise<DeployResult> {
    const summary = await inspectArchive(archive, this.deps.archiveLimits ?? DEFAULT_ARCHIVE_LIMITS)
    const { pool } = this.deps.runtime
    const revisionId = newId('revision')
    const staging = await pool.createStaging(revisionId)
    let agentId: string | undefined
    try {
      await extractArchive(archive, staging)
      const resolved = await readManifest(staging, nameOverride)
      const at = iso(this.deps.clock.now())
      agentId = this.deps.db.transaction(() => {
        const existing = this.store.find(tenantId, resolved.name)
        const id = existing?.id ?? newId('agent')
        if (!existing) this.store.insertAgent(id, tenantId, resolved.name, at)
        this.store.insertRevision({
          id: revisionId,
          agent_id: id,
          tenant_id: tenantId,
          status: 'DEPLOYING',
          content_hash: summary.contentHash,
          manifest_json: JSON.stringify({ ...resolved.manifest, resolvedCommand: resolved.command }),
          file_count: summary.fileCount,
          size_bytes: summary.sizeBytes,
          error: null,
          created_at: at,
        })
        return id
      })()
      await pool.sealRevision(staging, revisionId)
      this.deps.db.transaction(() => {
        this.store.setRevisionStatus(revisionId, 'READY', null)
        this.store.setCurrentRevision(agentId as string, revisionId, iso(this.deps.clock.now()))
      })()
    } catch (error) {
      await pool.discardStaging(staging).catch(() => undefined)
      if (agentId) this.store.setRevisionStatus(revisionId, 'FAILED', (error as Error).message)
      throw error
    }
    const agent = this.store.find(tenantId, agentId)
    const revision = this.store.revision(revisionId)
    if (!agent || !revision) throw new CairnProblem('internal', 'deployed agent vanished')
    this.deps.logger.info(
      { agent: agent.name, revision: revisionId, files: summary.fileCount },
      'agent deployed',
    )
    return { agent: this.store.toInfo(agent), revision: revisionInfo(revision) }
  }

  require(tenantId: string, idOrName: string): AgentRow {
    const agent = this.store.find(tenantId, idOrName)
    if (!agent) throw new CairnProblem('agent_not_found', `No agent found matching '${idOrName}'`)
    return agent
  }

  list(tenantId: string): AgentInfo[] {
    return this.store.list(tenantId).map((row) => this.store.toInfo(row))
  }

  get(tenantId: string, idOrName: string): AgentDetail {
    const agent = this.require(tenantId, idOrName)
    return { ...this.store.toInfo(agent), revisions: this.store.revisions(agent.id).map(revisionInfo) }
  }

  /** Secret names the agent's current revision declares in `cairn.yaml`. */
  requiredSecrets(agentId: string): string[] {
    const row = this.store.byId(agentId)
    const revision = row?.current_revision_id ? this.store.revision(row.current_revision_id) : undefined
    return revision?.manifest.secrets ?? []
  }

  delete(tenantId: string, idOrName: string): void {
    const agent = this.require(tenantId, idOrName)
    this.store.softDelete(agent.id, iso(this.deps.clock.now()))
  }
}
