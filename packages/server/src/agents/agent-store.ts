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
  private readonly stmts

  constructor(db: Db) {
    this.stmts = {
      byId: db.prepare<[string, string], AgentRow>(
        'SELECT * FROM agents WHERE tenant_id = ? AND id = ? AND deleted_at IS NULL',
      ),
      byIdAnyTenant: db.prepare<[string], AgentRow>('SELECT * FROM agents WHERE id = ?'),
      byName: db.prepare<[string, string], AgentRow>(
        'SELECT * FROM agents WHERE tenant_id = ? AND name = ? AND deleted_at IS NULL',
      ),
      list: db.prepare<[string], AgentRow>(
        'SELECT * FROM agents WHERE tenant_id = ? AND deleted_at IS NULL ORDER BY name',
      ),
      insertAgent: db.prepare(
        'INSERT INTO agents (id, tenant_id, name, current_revision_id, created_at, updated_at) VALUES (?, ?, ?, NULL, ?, ?)',
      ),
      setCurrent: db.prepare('UPDATE agents SET current_revision_id = ?, updated_at = ? WHERE id = ?'),
      softDelete: db.prepare('UPDATE agents SET deleted_at = ?, updated_at = ? WHERE id = ?'),
      insertRevision: db.prepare(
        `INSERT INTO revisions (id, agent_id, tenant_id, status, content_hash, manifest_json, file_count, size_bytes, error, created_at)
         VALUES (@id, @agent_id, @tenant_id, @status, @content_hash, @manifest_json, @file_count, @size_bytes, @error, @created_at)`,
      ),
      setRevisionStatus: db.prepare('UPDATE revisions SET status = ?, error = ? WHERE id = ?'),
      revision: db.prepare<[string], RevisionRow>('SELECT * FROM revisions WHERE id = ?'),
      revisions: db.prepare<[string], RevisionRow>(
        'SELECT * FROM revisions WHERE agent_id = ? ORDER BY created_at DESC, id DESC',
      ),
    }
  }

  find(tenantId: string, idOrName: string): AgentRow | undefined {
    return idOrName.startsWith('agt_')
      ? this.stmts.byId.get(tenantId, idOrName)
      : this.stmts.byName.get(tenantId, idOrName)
  }

  byId(agentId: string): AgentRow | undefined {
    return this.stmts.byIdAnyTenant.get(agentId)
  }

  list(tenantId: string): AgentRow[] {
    return this.stmts.list.all(tenantId)
  }

  insertAgent(id: string, tenantId: string, name: string, at: string): void {
    this.stmts.insertAgent.run(id, tenantId, name, at, at)
  }

  setCurrentRevision(agentId: string, revisionId: string, at: string): void {
    this.stmts.setCurrent.run(revisionId, at, agentId)
  }

  softDelete(agentId: string, at: string): void {
    this.stmts.softDelete.run(at, at, agentId)
  }

  insertRevision(row: RevisionRow & { tenant_id: string }): void {
    this.stmts.insertRevision.run(row)
  }

  setRevisionStatus(id: string, status: RevisionStatus, error: string | null): void {
    this.stmts.setRevisionStatus.run(status, error, id)
  }

  revision(id: string): StoredRevision | undefined {
    const row = this.stmts.revision.get(id)
    return row ? toRevision(row) : undefined
  }

  revisions(agentId: string): StoredRevision[] {
    return this.stmts.revisions.all(agentId).map(toRevision)
  }

  toInfo(row: AgentRow): AgentInfo {
    const current = row.current_revision_id ? this.revision(row.current_revision_id) : undefined
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
