import type { AgentInfo, AgentManifest, RevisionInfo, RevisionStatus } from '@cairn/protocol'
import type { Db } from '../db/database.js'

interface AgentRow {
  id: string
  tenant_id: string
  name: string
  current_revision_id: string | null
  created_at: string
  updated_at: string
}

interface RevisionRow {
  id: string
  agent_id: string
  status: RevisionStatus
  content_hash: string
  manifest_json: string
  file_count: number
  size_bytes: number
  error: string | null
  created_at: string
}

export interface StoredRevision extends RevisionInfo {
  manifest: AgentManifest & { resolvedCommand: string[]; envKey?: string | null; imageKey?: string | null }
}

/** Agents and their revisions (workflow state; tenant-scoped on every query). */
export class AgentStore {
  constructor(private readonly db: Db) {}

  async find(tenantId: string, idOrName: string): Promise<AgentRow | undefined> {
    return this.db.q
      .selectFrom('agents')
      .select(AGENT_COLUMNS)
      .where('tenant_id', '=', tenantId)
      .where(idOrName.startsWith('agt_') ? 'id' : 'name', '=', idOrName)
      .where('deleted_at', 'is', null)
      .executeTakeFirst()
  }

  async byId(agentId: string): Promise<AgentRow | undefined> {
    return this.db.q.selectFrom('agents').select(AGENT_COLUMNS).where('id', '=', agentId).executeTakeFirst()
  }

  async list(tenantId: string): Promise<AgentRow[]> {
    return this.db.q
      .selectFrom('agents')
      .select(AGENT_COLUMNS)
      .where('tenant_id', '=', tenantId)
      .where('deleted_at', 'is', null)
      .orderBy('name')
      .execute()
  }

  async insertAgent(id: string, tenantId: string, name: string, at: string): Promise<void> {
    await this.db.q
      .insertInto('agents')
      .values({ id, tenant_id: tenantId, name, current_revision_id: null, created_at: at, updated_at: at })
      .execute()
  }

  /**
   * Makes a finished build's revision current unless a newer revision of the agent (created later;
   * on the same instant, the higher ID, the order `revisions` lists) already is: one conditional
   * write, so concurrent builds on any replica and either database end with the newest deploy
   * current whatever order they finish in. Returns whether it became current.
   */
  async promoteFinishedRevision(
    agentId: string,
    revision: { id: string; createdAt: string },
    at: string,
  ): Promise<boolean> {
    const result = await this.db.q
      .updateTable('agents')
      .set({ current_revision_id: revision.id, updated_at: at })
      .where('id', '=', agentId)
      .where((eb) =>
        eb.not(
          eb.exists(
            eb
              .selectFrom('revisions as cur')
              .select('cur.id')
              .whereRef('cur.id', '=', 'agents.current_revision_id')
              .where((newer) =>
                newer.or([
                  newer('cur.created_at', '>', revision.createdAt),
                  newer.and([
                    newer('cur.created_at', '=', revision.createdAt),
                    newer('cur.id', '>', revision.id),
                  ]),
                ]),
              ),
          ),
        ),
      )
      .executeTakeFirst()
    return Number(result.numUpdatedRows) > 0
  }

  async softDelete(agentId: string, at: string): Promise<void> {
    await this.db.q
      .updateTable('agents')
      .set({ deleted_at: at, updated_at: at })
      .where('id', '=', agentId)
      .execute()
  }

  async insertRevision(row: RevisionRow & { tenant_id: string }): Promise<void> {
    await this.db.q.insertInto('revisions').values(row).execute()
  }

  async setRevisionStatus(id: string, status: RevisionStatus, error: string | null): Promise<void> {
    await this.db.q.updateTable('revisions').set({ status, error }).where('id', '=', id).execute()
  }

  async revision(id: string): Promise<StoredRevision | undefined> {
    const row = await this.db.q.selectFrom('revisions').selectAll().where('id', '=', id).executeTakeFirst()
    return row ? toRevision(row as RevisionRow) : undefined
  }

  async revisions(agentId: string): Promise<StoredRevision[]> {
    const rows = await this.db.q
      .selectFrom('revisions')
      .selectAll()
      .where('agent_id', '=', agentId)
      .orderBy('created_at', 'desc')
      .orderBy('id', 'desc')
      .execute()
    return rows.map((row) => toRevision(row as RevisionRow))
  }

  async toInfo(row: AgentRow): Promise<AgentInfo> {
    const current = row.current_revision_id ? await this.revision(row.current_revision_id) : undefined
    return {
      id: row.id,
      name: row.name,
      currentRevisionId: row.current_revision_id,
      command: current?.command ?? [],
      protocol: current?.protocol ?? 'stdio',
      createdAt: row.created_at,
      updatedAt: row.updated_at,
    }
  }
}

const AGENT_COLUMNS = ['id', 'tenant_id', 'name', 'current_revision_id', 'created_at', 'updated_at'] as const

function toRevision(row: RevisionRow): StoredRevision {
  const manifest = JSON.parse(row.manifest_json) as StoredRevision['manifest']
  return {
    id: row.id,
    agentId: row.agent_id,
    status: row.status,
    contentHash: row.content_hash,
    command: manifest.resolvedCommand,
    protocol: manifest.protocol ?? 'stdio',
    fileCount: row.file_count,
    sizeBytes: row.size_bytes,
    error: row.error,
    envKey: manifest.envKey ?? null,
    imageKey: manifest.imageKey ?? null,
    requiredSecrets: manifest.secrets ?? [],
    createdAt: row.created_at,
    manifest,
  }
}

export type { AgentRow }
