import { randomBytes } from 'node:crypto'
import net from 'node:net'
import { CairnProblem, type NetworkPolicy } from '@cairn/protocol'
import type { ProxySecret } from '@cairn/runtime/port'
import { sql } from 'kysely'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import type { SecretCipher } from './cipher.js'
import { assertBindingsAllowed, unreachableBindings } from './proxy-bindings.js'

export const SECRET_SCOPES = ['runtime', 'setup', 'proxy'] as const
export type SecretScope = (typeof SECRET_SCOPES)[number]
export const SECRET_NAME_PATTERN = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/
const MAX_SECRET_BYTES = 64 * 1024
const MAX_PROXY_HOSTS = 32
/** A proxy secret's host: a name (optionally `*.` wildcard) or an IP address, with an optional port. */
const HOST_PATTERN = /^(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*(:\d{1,5})?$/

function validHost(host: string): boolean {
  const bare = host.replace(/^\[(.*)\](:\d{1,5})?$/, '$1')
  return HOST_PATTERN.test(host) || net.isIP(bare) !== 0
}

/** Headers a proxy secret may name: tokens (RFC 9110), lowercased. */
const HEADER_NAME_PATTERN = /^[a-z0-9!#$%&'*+.^_`|~-]{1,64}$/
/** At most this many extra headers per proxy secret. */
export const MAX_PROXY_HEADERS = 16
/** Headers that frame or route the request: never a place for a credential. */
const UNSWAPPABLE_HEADERS = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'upgrade',
  'te',
  'trailer',
  'keep-alive',
  'proxy-connection',
])

/** The extra headers a proxy secret is swapped into, checked and lowercased. */
function proxyHeaders(scope: SecretScope, names: readonly string[]): string[] {
  const headers = [...new Set(names.map((name) => name.trim().toLowerCase()))]
  if (headers.length === 0) return headers
  if (scope !== 'proxy')
    throw new CairnProblem('validation_failed', 'headers apply to proxy secrets only (scope: proxy)')
  if (headers.length > MAX_PROXY_HEADERS)
    throw new CairnProblem('validation_failed', `at most ${MAX_PROXY_HEADERS} headers per secret`)
  for (const header of headers) {
    if (!HEADER_NAME_PATTERN.test(header) || UNSWAPPABLE_HEADERS.has(header))
      throw new CairnProblem('validation_failed', `invalid header '${header}' for a proxy secret`)
  }
  return headers
}

/** What the agent sees in place of a `proxy` secret's value. */
function newStandIn(): string {
  return `cairn-proxy-secret-${randomBytes(16).toString('hex')}`
}

export interface SetSecretsOptions {
  scope?: SecretScope | undefined
  /** Hosts a `proxy` secret is sent to (allowlist syntax); required for that scope, refused for others. */
  hosts?: readonly string[] | undefined
  /**
   * `proxy` scope: request headers the value is swapped into besides the credential headers
   * (`Authorization`, `X-Api-Key`, …: `CREDENTIAL_HEADERS`); refused for other scopes.
   */
  headers?: readonly string[] | undefined
  /**
   * `proxy` scope: the allowlist the hosts must be reachable under (the agent's current revision's
   * `network`) and how to name it; a host it does not allow is refused. Unset: not checked.
   */
  allowlist?: { network: NetworkPolicy | undefined; where: string } | undefined
  /** An ISO 8601 time in the future after which the secrets are no longer injected; null: never. */
  expiresAt?: string | null | undefined
}

export interface SecretInfo {
  name: string
  scope: SecretScope
  /** `proxy` scope: the hosts requests get the real value for. */
  hosts?: string[]
  /** `proxy` scope: headers it is swapped into besides the credential headers (when any). */
  headers?: string[]
  createdAt: string
  updatedAt: string
  expiresAt: string | null
}

interface SecretRow {
  name: string
  scope: SecretScope
  ciphertext: Buffer
  iv: Buffer
  tag: Buffer
  stand_in: string | null
  hosts_json: string | null
  headers_json: string | null
  expires_at: string | null
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

  /** The scope's secrets that have not expired: an expired one is never injected, deleted or not. */
  private async ofScope(tenantId: string, agentId: string, scope: SecretScope): Promise<SecretRow[]> {
    const now = iso(this.clock.now())
    return (await this.db.q
      .selectFrom('secrets')
      .selectAll()
      .where('tenant_id', '=', tenantId)
      .where('agent_id', '=', agentId)
      .where('scope', '=', scope)
      .where((eb) => eb.or([eb('expires_at', 'is', null), eb('expires_at', '>', now)]))
      .orderBy('name')
      .execute()) as SecretRow[]
  }

  /** `expiresAt` as stored (ISO 8601 in UTC), refused unless it is a valid time in the future. */
  private expiry(expiresAt: string | null | undefined): string | null {
    if (expiresAt === null || expiresAt === undefined) return null
    const ms = Date.parse(expiresAt)
    if (!Number.isFinite(ms))
      throw new CairnProblem('validation_failed', `expiresAt '${expiresAt}' is not an ISO 8601 time`)
    if (ms <= this.clock.now())
      throw new CairnProblem('validation_failed', `expiresAt '${expiresAt}' is not in the future`)
    return iso(ms)
  }

  async set(
    tenantId: string,
    agentId: string,
    values: Record<string, string>,
    options: SetSecretsOptions = {},
  ): Promise<void> {
    const scope = options.scope ?? 'runtime'
    const hosts = [...new Set((options.hosts ?? []).map((h) => h.trim().toLowerCase()))]
    if (scope === 'proxy' && hosts.length === 0) {
      throw new CairnProblem('validation_failed', 'a proxy secret needs the hosts it is sent to (hosts)')
    }
    if (scope !== 'proxy' && hosts.length > 0) {
      throw new CairnProblem('validation_failed', 'hosts apply to proxy secrets only (scope: proxy)')
    }
    if (hosts.length > MAX_PROXY_HOSTS) {
      throw new CairnProblem('validation_failed', `at most ${MAX_PROXY_HOSTS} hosts per secret`)
    }
    for (const host of hosts) {
      if (!validHost(host)) throw new CairnProblem('validation_failed', `invalid host '${host}'`)
    }
    const headers = proxyHeaders(scope, options.headers ?? [])
    const expiresAt = this.expiry(options.expiresAt)
    if (scope === 'proxy' && options.allowlist) {
      const bindings = Object.keys(values).map((name) => ({ name, hosts }))
      assertBindingsAllowed(
        'validation_failed',
        unreachableBindings(bindings, options.allowlist.network),
        options.allowlist.where,
      )
    }
    const at = iso(this.clock.now())
    for (const [name, value] of Object.entries(values)) {
      if (!SECRET_NAME_PATTERN.test(name)) {
        throw new CairnProblem(
          'validation_failed',
          `invalid secret name '${name}': use letters, digits and '_'`,
        )
      }
      // A value reaches the sandbox as an environment variable, a C string: it holds no NUL.
      if (value.includes('\0'))
        throw new CairnProblem('validation_failed', `secret '${name}' holds a NUL character`)
      if (Buffer.byteLength(value) > MAX_SECRET_BYTES) {
        throw new CairnProblem(
          'validation_failed',
          `secret '${name}' is larger than ${MAX_SECRET_BYTES} bytes`,
        )
      }
    }
    // One transaction: every value is stored, or none.
    await this.db.transaction(async () => {
      for (const [name, value] of Object.entries(values)) {
        const sealed = this.cipher.seal(value, `${agentId}/${name}`)
        await this.db.q
          .insertInto('secrets')
          .values({
            agent_id: agentId,
            tenant_id: tenantId,
            name,
            scope,
            ciphertext: sealed.ciphertext,
            iv: sealed.iv,
            tag: sealed.tag,
            key_version: sealed.keyVersion,
            stand_in: scope === 'proxy' ? newStandIn() : null,
            hosts_json: scope === 'proxy' ? JSON.stringify(hosts) : null,
            headers_json: headers.length > 0 ? JSON.stringify(headers) : null,
            expires_at: expiresAt,
            created_at: at,
            updated_at: at,
          })
          // A secret keeps its stand-in when its value changes, so copies the agent made still work.
          .onConflict((oc) =>
            oc.columns(['agent_id', 'name']).doUpdateSet((eb) => ({
              scope: eb.ref('excluded.scope'),
              ciphertext: eb.ref('excluded.ciphertext'),
              iv: eb.ref('excluded.iv'),
              tag: eb.ref('excluded.tag'),
              key_version: eb.ref('excluded.key_version'),
              stand_in: sql<
                string | null
              >`CASE WHEN excluded.scope = 'proxy' THEN COALESCE(secrets.stand_in, excluded.stand_in) END`,
              hosts_json: eb.ref('excluded.hosts_json'),
              headers_json: eb.ref('excluded.headers_json'),
              expires_at: eb.ref('excluded.expires_at'),
              updated_at: eb.ref('excluded.updated_at'),
            })),
          )
          .execute()
      }
    })
  }

  async list(agentId: string): Promise<SecretInfo[]> {
    const rows = (await this.db.q
      .selectFrom('secrets')
      .selectAll()
      .where('agent_id', '=', agentId)
      .orderBy('name')
      .execute()) as SecretRow[]
    return rows.map((r) => ({
      name: r.name,
      scope: r.scope,
      ...(r.hosts_json ? { hosts: JSON.parse(r.hosts_json) as string[] } : {}),
      ...(r.headers_json ? { headers: JSON.parse(r.headers_json) as string[] } : {}),
      createdAt: r.created_at,
      updatedAt: r.updated_at,
      expiresAt: r.expires_at,
    }))
  }

  async delete(agentId: string, name: string): Promise<boolean> {
    const result = await this.db.q
      .deleteFrom('secrets')
      .where('agent_id', '=', agentId)
      .where('name', '=', name)
      .executeTakeFirst()
    return result.numDeletedRows > 0n
  }

  /** Decrypted values of the given scopes (all of them, for redaction). */
  async values(agentId: string, scopes: readonly SecretScope[]): Promise<Record<string, string>> {
    const out: Record<string, string> = {}
    // Every turn reads them (its redaction): compiled once.
    const { rows } = await this.db.shaped('secrets of an agent', { agentId }, (q, a) =>
      q.selectFrom('secrets').selectAll().where('agent_id', '=', a.agentId),
    )
    for (const row of rows as SecretRow[]) {
      if (scopes.includes(row.scope)) out[row.name] = this.cipher.open(row, `${agentId}/${row.name}`)
    }
    return out
  }

  /**
   * Decrypted values of one scope, tenant-checked: `setup` for the revision build, `runtime` for
   * the agent's environment; `proxy` values only ever reach the egress proxy.
   */
  async valuesForScope(
    tenantId: string,
    agentId: string,
    scope: SecretScope,
  ): Promise<Record<string, string>> {
    const out: Record<string, string> = {}
    const rows = await this.ofScope(tenantId, agentId, scope)
    for (const row of rows) out[row.name] = this.cipher.open(row, `${agentId}/${row.name}`)
    return out
  }

  /** The agent's `proxy` secrets with their stand-ins and hosts, for its egress proxy. */
  async proxySecrets(tenantId: string, agentId: string): Promise<ProxySecret[]> {
    return (await this.ofScope(tenantId, agentId, 'proxy'))
      .filter((row) => row.stand_in !== null)
      .map((row) => ({
        name: row.name,
        standIn: row.stand_in as string,
        value: this.cipher.open(row, `${agentId}/${row.name}`),
        hosts: JSON.parse(row.hosts_json ?? '[]') as string[],
        headers: JSON.parse(row.headers_json ?? '[]') as string[],
      }))
  }

  /** When the first of the agent's unexpired secrets in `scopes` expires; null: none does. */
  async firstExpiry(
    tenantId: string,
    agentId: string,
    scopes: readonly SecretScope[],
  ): Promise<string | null> {
    const row = await this.db.q
      .selectFrom('secrets')
      .select((eb) => eb.fn.min<string | null>('expires_at').as('at'))
      .where('tenant_id', '=', tenantId)
      .where('agent_id', '=', agentId)
      .where('scope', 'in', [...scopes])
      .where('expires_at', '>', iso(this.clock.now()))
      .executeTakeFirst()
    return row?.at ?? null
  }

  /** Required secrets not set, or expired. */
  async missing(agentId: string, required: readonly string[]): Promise<string[]> {
    const now = iso(this.clock.now())
    const live = (await this.list(agentId)).filter((s) => s.expiresAt === null || s.expiresAt > now)
    const have = new Set(live.map((s) => s.name))
    return required.filter((name) => !have.has(name))
  }
}
