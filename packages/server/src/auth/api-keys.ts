import { createHash, randomBytes } from 'node:crypto'
import { CairnProblem, newId } from '@cairn/protocol'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'

export type Role = 'admin' | 'read'

export interface Principal {
  keyId: string
  tenantId: string
  role: Role
}

export const DEFAULT_TENANT_ID = 'tnt_default'

export interface KeyInfo {
  id: string
  prefix: string
  role: Role
  name: string | null
  tenantId: string
  createdAt: string
  lastUsedAt: string | null
  revokedAt: string | null
}

interface KeyRow {
  id: string
  tenant_id: string
  prefix: string
  role: Role
  name: string | null
  created_at: string
  last_used_at: string | null
  revoked_at: string | null
}
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

  /**
   * Creates a key unless the tenant already holds `maxActive` active keys (`key_limit_reached`);
   * the count and the insert are one transaction, so concurrent creations cannot pass it together.
   */
  createWithin(tenantId: string, role: Role, maxActive: number, name?: string): { id: string; key: string } {
    return this.db.transaction(() => {
      const active = (
        this.db
          .prepare<[string], { n: number }>(
            'SELECT COUNT(*) AS n FROM api_keys WHERE tenant_id = ? AND revoked_at IS NULL',
          )
          .get(tenantId) as { n: number }
      ).n
      if (active >= maxActive)
        throw new CairnProblem(
          'key_limit_reached',
          `this tenant already holds ${active} active API keys, the most this server allows (${maxActive}, CAIRN_MAX_KEYS_PER_TENANT): revoke one first`,
          { limit: 'maxKeysPerTenant', value: active, ceiling: maxActive },
        )
      return this.create(tenantId, role, name)
    })()
  }

  tenantByNameIfExists(name: string): string | undefined {
    return this.db
      .prepare<[string, string], { id: string }>('SELECT id FROM tenants WHERE id = ? OR name = ?')
      .get(name, name)?.id
  }

  /** The tenant with this name (or ID), created on first use. */
  tenantByName(name: string): string {
    const existing = this.db
      .prepare<[string, string], { id: string }>('SELECT id FROM tenants WHERE id = ? OR name = ?')
      .get(name, name)
    if (existing) return existing.id
    const id = newId('tenant')
    this.ensureTenant(id, name)
    return id
  }

  list(tenantId: string): KeyInfo[] {
    return this.db
      .prepare<[string], KeyRow>('SELECT * FROM api_keys WHERE tenant_id = ? ORDER BY created_at')
      .all(tenantId)
      .map((r) => ({
        id: r.id,
        prefix: r.prefix,
        role: r.role,
        name: r.name,
        tenantId: r.tenant_id,
        createdAt: r.created_at,
        lastUsedAt: r.last_used_at,
        revokedAt: r.revoked_at,
      }))
  }

  /** Revokes a key of the tenant; the verification cache forgets it at once. */
  revoke(tenantId: string, keyId: string): boolean {
    const changed =
      this.db
        .prepare('UPDATE api_keys SET revoked_at = ? WHERE id = ? AND tenant_id = ? AND revoked_at IS NULL')
        .run(iso(this.clock.now()), keyId, tenantId).changes > 0
    for (const [hash, principal] of this.cache) if (principal.keyId === keyId) this.cache.delete(hash)
    return changed
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
