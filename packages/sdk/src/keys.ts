import type { ApiKeyInfoSchema } from '@cairn/protocol'
import type { Static } from '@sinclair/typebox'
import { checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import * as valid from './validators.js'

export type ApiKeyRole = 'admin' | 'read'

/** The fields of a key's listing; the key itself is never returned after it is created. */
export const API_KEY_INFO_FIELDS = [
  'id',
  'prefix',
  'role',
  'name',
  'tenantId',
  'createdAt',
  'lastUsedAt',
  'revokedAt',
] as const

export interface ApiKeyInfo {
  id: string
  /** The first characters of the key, to recognise it by. */
  prefix: string
  role: ApiKeyRole
  name: string | null
  tenantId: string
  createdAt: string
  lastUsedAt: string | null
  revokedAt: string | null
}

/** A new key: `key` is the secret, returned this once only. */
export interface CreatedApiKey {
  id: string
  key: string
  tenantId: string
  role: ApiKeyRole
}

export interface CreateApiKeyOptions extends RequestOptions {
  /** A tenant's name or ID (created on first use); only the install admin creates keys for others. */
  tenant?: string | undefined
  /** Default `admin`; `read` keys cannot change anything. */
  role?: ApiKeyRole | undefined
  name?: string | undefined
}

/**
 * Only the fields this SDK names (what it returns stays the same whatever a newer server adds). The
 * wire says string for a role, so a newer server may add one; this server answers `admin` or `read`.
 */
function keyInfo(k: Static<typeof ApiKeyInfoSchema>): ApiKeyInfo {
  const { id, prefix, role, name, tenantId, createdAt, lastUsedAt, revokedAt } = k
  return { id, prefix, role: role as ApiKeyRole, name, tenantId, createdAt, lastUsedAt, revokedAt }
}

/** API keys of the caller's tenant: create (the key is shown once), list (prefixes only), revoke. Admin keys only. */
export class Keys {
  constructor(private readonly http: HttpClient) {}

  async create(options: CreateApiKeyOptions = {}): Promise<CreatedApiKey> {
    const { tenant, role, name, ...request } = options
    const body = await this.http.json({
      method: 'POST',
      path: '/v1/keys',
      json: { tenant, role, name },
      ...request,
    })
    const created = checked(valid.CreatedApiKey, body, 'new API key')
    // A role as for `keyInfo`.
    return { id: created.id, key: created.key, tenantId: created.tenantId, role: created.role as ApiKeyRole }
  }

  /** Every key of the tenant, revoked ones included (oldest first). */
  async list(options: RequestOptions = {}): Promise<ApiKeyInfo[]> {
    const body = await this.http.json({ method: 'GET', path: '/v1/keys', ...options })
    return checked(valid.ApiKeyList, body, 'API key list').data.map(keyInfo)
  }

  /** Revokes a key at once; throws `NotFoundError` when there is no active key with that ID. */
  async revoke(id: string, options: RequestOptions = {}): Promise<void> {
    await this.http.json({ method: 'DELETE', path: `/v1/keys/${encodeURIComponent(id)}`, ...options })
  }
}
