import { randomBytes } from 'node:crypto'
import net from 'node:net'
import { CairnProblem, type NetworkPolicy } from '@cairn/protocol'
import type { ProxySecret } from '@cairn/runtime/port'
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
  created_at: string
  updated_at: string
}

/** Per-agent secrets, encrypted at rest; values leave only towards a sandbox, never to the API. */
export class SecretStore {
  /** The reads every turn or cold start makes, prepared once. */
  private readonly s

  constructor(
    private readonly db: Db,
    private readonly cipher: SecretCipher,
    private readonly clock: Clock,
  ) {
    this.s = {
      ofAgent: db.prepare<[string], SecretRow>('SELECT * FROM secrets WHERE agent_id = ?'),
      ofScope: db.prepare<[string, string, string], SecretRow>(
        'SELECT * FROM secrets WHERE tenant_id = ? AND agent_id = ? AND scope = ? ORDER BY name',
      ),
    }
  }

  set(
    tenantId: string,
    agentId: string,
    values: Record<string, string>,
    options: SetSecretsOptions = {},
  ): void {
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
    if (scope === 'proxy' && options.allowlist) {
      const bindings = Object.keys(values).map((name) => ({ name, hosts }))
      assertBindingsAllowed(
        'validation_failed',
        unreachableBindings(bindings, options.allowlist.network),
        options.allowlist.where,
      )
    }
    const at = iso(this.clock.now())
    // A secret keeps its stand-in when its value changes, so copies the agent made still work.
    const upsert = this.db.prepare(
      `INSERT INTO secrets (agent_id, tenant_id, name, scope, ciphertext, iv, tag, key_version, stand_in, hosts_json, headers_json, created_at, updated_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT(agent_id, name) DO UPDATE SET scope = excluded.scope, ciphertext = excluded.ciphertext,
         iv = excluded.iv, tag = excluded.tag, key_version = excluded.key_version,
         stand_in = CASE WHEN excluded.scope = 'proxy' THEN COALESCE(secrets.stand_in, excluded.stand_in) END,
         hosts_json = excluded.hosts_json, headers_json = excluded.headers_json, updated_at = excluded.updated_at`,
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
          scope === 'proxy' ? newStandIn() : null,
          scope === 'proxy' ? JSON.stringify(hosts) : null,
          headers.length > 0 ? JSON.stringify(headers) : null,
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
      .map((r) => ({
        name: r.name,
        scope: r.scope,
        ...(r.hosts_json ? { hosts: JSON.parse(r.hosts_json) as string[] } : {}),
        ...(r.headers_json ? { headers: JSON.parse(r.headers_json) as string[] } : {}),
        createdAt: r.created_at,
        updatedAt: r.updated_at,
      }))
  }

  delete(agentId: string, name: string): boolean {
    return (
      this.db.prepare('DELETE FROM secrets WHERE agent_id = ? AND name = ?').run(agentId, name).changes > 0
    )
  }

  /** Decrypted values of the given scopes (all of them, for redaction). */
  values(agentId: string, scopes: readonly SecretScope[]): Record<string, string> {
    const out: Record<string, string> = {}
    const rows = this.s.ofAgent.all(agentId)
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
    const rows = this.s.ofScope.all(tenantId, agentId, scope)
    for (const row of rows) out[row.name] = this.cipher.open(row, `${agentId}/${row.name}`)
    return out
  }

  /** The agent's `proxy` secrets with their stand-ins and hosts, for its egress proxy. */
  proxySecrets(tenantId: string, agentId: string): ProxySecret[] {
    return this.s.ofScope
      .all(tenantId, agentId, 'proxy')
      .filter((row) => row.stand_in !== null)
      .map((row) => ({
        name: row.name,
        standIn: row.stand_in as string,
        value: this.cipher.open(row, `${agentId}/${row.name}`),
        hosts: JSON.parse(row.hosts_json ?? '[]') as string[],
        headers: JSON.parse(row.headers_json ?? '[]') as string[],
      }))
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
