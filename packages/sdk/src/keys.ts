import { InvalidResponseError } from './errors.js'
import type { HttpClient, RequestOptions } from './http.js'

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

const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v)
const nullableString = (v: unknown) => (typeof v === 'string' ? v : null)

function unexpected(what: string): InvalidResponseError {
  return new InvalidResponseError({
    code: 'invalid_response',
    message: `the server sent an unexpected ${what}`,
  })
}

function asKeyInfo(v: unknown): ApiKeyInfo {
  if (!isRecord(v) || typeof v.id !== 'string' || typeof v.prefix !== 'string') throw unexpected('API key')
  return {
    id: v.id,
    prefix: v.prefix,
    role: String(v.role ?? '') as ApiKeyRole,
    name: nullableString(v.name),
    tenantId: String(v.tenantId ?? ''),
    createdAt: String(v.createdAt ?? ''),
    lastUsedAt: nullableString(v.lastUsedAt),
    revokedAt: nullableString(v.revokedAt),
  }
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
    if (!isRecord(body) || typeof body.id !== 'string' || typeof body.key !== 'string') {
      throw unexpected('new API key')
    }
    return {
      id: body.id,
      key: body.key,
      tenantId: String(body.tenantId ?? ''),
      role: String(body.role ?? '') as ApiKeyRole,
    }
  }

  /** Every key of the tenant, revoked ones included (oldest first). */
  async list(options: RequestOptions = {}): Promise<ApiKeyInfo[]> {
    const body = await this.http.json({ method: 'GET', path: '/v1/keys', ...options })
    if (!isRecord(body) || !Array.isArray(body.data)) throw unexpected('API key list')
    return body.data.map(asKeyInfo)
  }

  /** Revokes a key at once; throws `NotFoundError` when there is no active key with that ID. */
  async revoke(id: string, options: RequestOptions = {}): Promise<void> {
    await this.http.json({ method: 'DELETE', path: `/v1/keys/${encodeURIComponent(id)}`, ...options })
  }
}
