import { createHash, randomBytes } from 'node:crypto'
import { CairnProblem, newId } from '@cairn/protocol'
import { type Clock, iso } from '../clock.js'
import type { HintFeed } from '../cluster/cluster-hints.js'
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

/**
 * API keys, stored as SHA-256 hashes; the plain key is shown once, at creation. A verified key is
 * remembered (one query per request saved). With replicas (`hints`) a revocation made by any of
 * them reaches the others as a hint, and a key remembered while hints could have been missed is
 * read again: it is trusted only within the stretch of listening it was verified in.
 */
export class ApiKeyStore {
  private readonly cache = new Map<string, { principal: Principal; stretch: number | undefined }>()
  /** Revocations heard so far: a verification that overlapped one does not remember its answer. */
  private revocationsHeard = 0

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly hints?: HintFeed,
  ) {
    void hints?.subscribe((hint) => {
      if (hint.kind !== 'key.revoke') return
      this.revocationsHeard++
      this.forget(hint.keyId)
    })
  }

  private forget(keyId: string): void {
    for (const [hash, entry] of this.cache) if (entry.principal.keyId === keyId) this.cache.delete(hash)
  }

  async ensureTenant(tenantId: string, name: string): Promise<void> {
    await this.db.q
      .insertInto('tenants')
      .values({ id: tenantId, name, created_at: iso(this.clock.now()) })
      .onConflict((oc) => oc.doNothing())
      .execute()
  }

  async count(): Promise<number> {
    const row = await this.db.q
      .selectFrom('api_keys')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .where('revoked_at', 'is', null)
      .executeTakeFirstOrThrow()
    return Number(row.n)
  }

  async create(tenantId: string, role: Role, name?: string): Promise<{ id: string; key: string }> {
    const key = KEY_PREFIX + randomBytes(24).toString('base64url')
    const id = newId('apiKey')
    await this.db.q
      .insertInto('api_keys')
      .values({
        id,
        tenant_id: tenantId,
        hash: hashKey(key),
        prefix: key.slice(0, KEY_PREFIX.length + 4),
        role,
        name: name ?? null,
        created_at: iso(this.clock.now()),
      })
      .execute()
    return { id, key }
  }

  /**
   * Creates a key unless the tenant already holds `maxActive` active keys (`key_limit_reached`);
   * the count and the insert are one transaction (the tenant's row locked on PostgreSQL), so
   * concurrent creations cannot pass it together.
   */
  async createWithin(
    tenantId: string,
    role: Role,
    maxActive: number,
    name?: string,
  ): Promise<{ id: string; key: string }> {
    return this.db.transaction(async () => {
      if (this.db.dialect === 'postgres')
        await this.db.q.selectFrom('tenants').select('id').where('id', '=', tenantId).forUpdate().execute()
      const row = await this.db.q
        .selectFrom('api_keys')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .where('tenant_id', '=', tenantId)
        .where('revoked_at', 'is', null)
        .executeTakeFirstOrThrow()
      const active = Number(row.n)
      if (active >= maxActive)
        throw new CairnProblem(
          'key_limit_reached',
          `this tenant already holds ${active} active API keys, the most this server allows (${maxActive}, CAIRN_MAX_KEYS_PER_TENANT): revoke one first`,
          { limit: 'maxKeysPerTenant', value: active, ceiling: maxActive },
        )
      return this.create(tenantId, role, name)
    })
  }

  async tenantByNameIfExists(name: string): Promise<string | undefined> {
    const row = await this.db.q
      .selectFrom('tenants')
      .select('id')
      .where((eb) => eb.or([eb('id', '=', name), eb('name', '=', name)]))
      .executeTakeFirst()
    return row?.id
  }

  /** The tenant with this name (or ID), created on first use. */
  async tenantByName(name: string): Promise<string> {
    const existing = await this.tenantByNameIfExists(name)
    if (existing) return existing
    const id = newId('tenant')
    await this.ensureTenant(id, name)
    return id
  }

  async list(tenantId: string): Promise<KeyInfo[]> {
    const rows = (await this.db.q
      .selectFrom('api_keys')
      .select(['id', 'tenant_id', 'prefix', 'role', 'name', 'created_at', 'last_used_at', 'revoked_at'])
      .where('tenant_id', '=', tenantId)
      .orderBy('created_at')
      .execute()) as KeyRow[]
    return rows.map((r) => ({
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

  /**
   * Revokes a key of the tenant; this process forgets it at once, the other replicas when its
   * hint reaches them.
   */
  async revoke(tenantId: string, keyId: string): Promise<boolean> {
    // The hint in the same transaction (NOTIFY is sent on commit): a revocation is never committed
    // without it.
    const revoked = await this.db.transaction(async () => {
      const result = await this.db.q
        .updateTable('api_keys')
        .set({ revoked_at: iso(this.clock.now()) })
        .where('id', '=', keyId)
        .where('tenant_id', '=', tenantId)
        .where('revoked_at', 'is', null)
        .executeTakeFirst()
      if (result.numUpdatedRows > 0n) await this.hints?.publish({ kind: 'key.revoke', keyId })
      return result.numUpdatedRows > 0n
    })
    this.revocationsHeard++
    this.forget(keyId)
    return revoked
  }

  async verify(key: string): Promise<Principal | undefined> {
    if (!key.startsWith(KEY_PREFIX) || key.length > 200) return undefined
    const hash = hashKey(key)
    // With replicas, nothing is remembered while hints could be missed.
    const stretch = this.hints?.continuity
    const remembering = !this.hints || stretch !== undefined
    const cached = this.cache.get(hash)
    if (remembering && cached && cached.stretch === stretch) return cached.principal
    const heard = this.revocationsHeard
    const row = await this.db.q
      .selectFrom('api_keys')
      .select(['id', 'tenant_id', 'role'])
      .where('hash', '=', hash)
      .where('revoked_at', 'is', null)
      .executeTakeFirst()
    if (!row) return undefined
    const principal: Principal = { keyId: row.id, tenantId: row.tenant_id, role: row.role as Role }
    if (remembering && this.revocationsHeard === heard && this.hints?.continuity === stretch)
      this.cache.set(hash, { principal, stretch })
    await this.db.q
      .updateTable('api_keys')
      .set({ last_used_at: iso(this.clock.now()) })
      .where('id', '=', row.id)
      .execute()
    return principal
  }
}
