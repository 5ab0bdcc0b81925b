import { createHash, randomBytes } from 'node:crypto'
import { newId } from '@cairn/protocol'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'

export type Role = 'admin' | 'read'

export interface Principal {
  keyId: string
  tenantId: string
  role: Role
}

export const DEFAULT_TENANT_ID = 'tnt_default'
const KEY_PREFIX = 'cairn_sk_'

function hashKey(key: string): string {
  return createHash('sha256').update(key).digest('hex')
}

/** API keys, stored as SHA-256 hashes; the plain key is shown once, at creation. */
export class ApiKeyStore {
  private readonly byHash: import('better-sqlite3').Statement<
    [string],
    { id: string; tenant_id: string; role: Role }
  >
  private readonly touch: import('better-sqlite3').Statement<[string, string]>
  private readonly cache = new Map<string, Principal>()

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
  ) {
    this.byHash = db.prepare('SELECT id, tenant_id, role FROM api_keys WHERE hash = ? AND revoked_at IS NULL')
    this.touch = db.prepare('UPDATE api_keys SET last_used_at = ? WHERE id = ?')
  }

  ensureTenant(tenantId: string, name: string): void {
    this.db
      .prepare('INSERT OR IGNORE INTO tenants (id, name, created_at) VALUES (?, ?, ?)')
      .run(tenantId, name, iso(this.clock.now()))
  }

  count(): number {
    return (
      this.db.prepare('SELECT COUNT(*) AS n FROM api_keys WHERE revoked_at IS NULL').get() as { n: number }
    ).n
  }

  create(tenantId: string, role: Role, name?: string): { id: string; key: string } {
    const key = KEY_PREFIX + randomBytes(24).toString('base64url')
    const id = newId('apiKey')
    this.db
      .prepare(
        'INSERT INTO api_keys (id, tenant_id, hash, prefix, role, name, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)',
      )
      .run(
        id,
        tenantId,
        hashKey(key),
        key.slice(0, KEY_PREFIX.length + 4),
        role,
        name ?? null,
        iso(this.clock.now()),
      )
    return { id, key }
  }

  verify(key: string): Principal | undefined {
    if (!key.startsWith(KEY_PREFIX) || key.length > 200) return undefined
    const hash = hashKey(key)
    const cached = this.cache.get(hash)
    if (cached) return cached
    const row = this.byHash.get(hash)
    if (!row) return undefined
    const principal: Principal = { keyId: row.id, tenantId: row.tenant_id, role: row.role }
    this.cache.set(hash, principal)
    this.touch.run(iso(this.clock.now()), row.id)
    return principal
  }
}
