import { CairnProblem } from '@cairn/protocol'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import type { SecretCipher } from './cipher.js'

export const SECRET_SCOPES = ['runtime', 'setup', 'proxy'] as const
export type SecretScope = (typeof SECRET_SCOPES)[number]
export const SECRET_NAME_PATTERN = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/
const MAX_SECRET_BYTES = 64 * 1024

export interface SecretInfo {
  name: string
  scope: SecretScope
  createdAt: string
  updatedAt: string
}

interface SecretRow {
  name: string
  scope: SecretScope
  ciphertext: Buffer
  iv: Buffer
  tag: Buffer
  created_at: string
  updated_at: string
}

/** Per-agent secrets, encrypted at rest; values leave only towards a sandbox, never to the API. */
export class SecretStore {
  constructor(
    private readonly db: Db,
    private readonly cipher: SecretCipher,
    private readonly clock: Clock,
  ) {}

  set(
    tenantId: string,
    agentId: string,
    values: Record<string, string>,
    scope: SecretScope = 'runtime',
  ): void {
    const at = iso(this.clock.now())
    const upsert = this.db.prepare(
      `INSERT INTO secrets (agent_id, tenant_id, name, scope, ciphertext, iv, tag, key_version, created_at, updated_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT(agent_id, name) DO UPDATE SET scope = excluded.scope, ciphertext = excluded.ciphertext,
         iv = excluded.iv, tag = excluded.tag, key_version = excluded.key_version, updated_at = excluded.updated_at`,
    )
    for (const [name, value] of Object.entries(values)) {
      if (!SECRET_NAME_PATTERN.test(name)) {
        throw new CairnProblem(
          'validation_failed',
          `invalid secret name '${name}': use letters, digits and '_'`,
        )
      }
      if (Buffer.byteLength(value) > MAX_SECRET_BYTES) {
        throw new CairnProblem(
          'validation_failed',
          `secret '${name}' is larger than ${MAX_SECRET_BYTES} bytes`,
        )
      }
    }
    this.db.transaction(() => {
      for (const [name, value] of Object.entries(values)) {
        const sealed = this.cipher.seal(value, `${agentId}/${name}`)
        upsert.run(
          agentId,
          tenantId,
          name,
          scope,
          sealed.ciphertext,
          sealed.iv,
          sealed.tag,
          sealed.keyVersion,
          at,
          at,
        )
      }
    })()
  }

  list(agentId: string): SecretInfo[] {
    return this.db
      .prepare<[string], SecretRow>('SELECT * FROM secrets WHERE agent_id = ? ORDER BY name')
      .all(agentId)
      .map((r) => ({ name: r.name, scope: r.scope, createdAt: r.created_at, updatedAt: r.updated_at }))
  }

  delete(agentId: string, name: string): boolean {
    return (
      this.db.prepare('DELETE FROM secrets WHERE agent_id = ? AND name = ?').run(agentId, name).changes > 0
    )
  }

  /** Decrypted values of the given scopes (all of them, for redaction). */
  values(agentId: string, scopes: readonly SecretScope[]): Record<string, string> {
    const out: Record<string, string> = {}
    const rows = this.db.prepare<[string], SecretRow>('SELECT * FROM secrets WHERE agent_id = ?').all(agentId)
    for (const row of rows) {
      if (scopes.includes(row.scope)) out[row.name] = this.cipher.open(row, `${agentId}/${row.name}`)
    }
    return out
  }

  /**
   * Decrypted values of one scope, tenant-checked: `setup` for the revision build, `runtime` for
   * the agent's environment; `proxy` values only ever reach the egress proxy.
   */
  valuesForScope(tenantId: string, agentId: string, scope: SecretScope): Record<string, string> {
    const out: Record<string, string> = {}
    const rows = this.db
      .prepare<[string, string, string], SecretRow>(
        'SELECT * FROM secrets WHERE tenant_id = ? AND agent_id = ? AND scope = ? ORDER BY name',
      )
      .all(tenantId, agentId, scope)
    for (const row of rows) out[row.name] = this.cipher.open(row, `${agentId}/${row.name}`)
    return out
  }

  missing(agentId: string, required: readonly string[]): string[] {
    const have = new Set(this.list(agentId).map((s) => s.name))
    return required.filter((name) => !have.has(name))
  }
}

/** Replaces every secret value in a text with a marker naming it (transcripts, logs, build output). */
export function redact(text: string, secrets: Record<string, string>): string {
  let out = text
  for (const [name, value] of Object.entries(secrets)) {
    if (value.length < 4) continue
    out = out.split(value).join(`[redacted:${name}]`)
  }
  return out
}
