import { checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import * as valid from './validators.js'

export type SecretScope = 'setup' | 'runtime' | 'proxy'

/** The fields of a secret's listing; values are never returned. */
export const SECRET_INFO_FIELDS = ['name', 'scope', 'createdAt', 'updatedAt'] as const
export type SecretInfo = Record<(typeof SECRET_INFO_FIELDS)[number], string> & {
  /** `proxy` scope: the hosts whose requests get the real value in place of the stand-in. */
  hosts?: string[]
  /** `proxy` scope: headers it is swapped into besides the credential headers (`Authorization`, …). */
  headers?: string[]
  /** When it stops being injected and is deleted by retention; null: never (absent: a server without expiries). */
  expiresAt?: string | null
}

export interface SecretList {
  data: SecretInfo[]
  /** Secrets the agent's cairn.yaml requires that are not set yet. */
  missing: string[]
}

const path = (agent: string, rest = '') => `/v1/agents/${encodeURIComponent(agent)}/secrets${rest}`

/** The secret list, with only the fields this SDK names (whatever a newer server adds). */
function asSecretList(body: unknown): SecretList {
  const list = checked(valid.SecretList, body, 'secret list')
  const data = list.data.map(({ name, scope, createdAt, updatedAt, hosts, headers, expiresAt }) => {
    const info: SecretInfo = { name, scope, createdAt, updatedAt, expiresAt }
    if (hosts) info.hosts = hosts
    if (headers) info.headers = headers
    return info
  })
  return { data, missing: list.missing }
}

/** An agent's secrets: encrypted at rest, handed to its sandboxes, never readable through the API. */
export class Secrets {
  constructor(private readonly http: HttpClient) {}

  async list(agent: string, options: RequestOptions = {}): Promise<SecretList> {
    return asSecretList(await this.http.json({ method: 'GET', path: path(agent), ...options }))
  }

  /**
   * Sets (or replaces) secrets by name. `scope`: `runtime` (default, an environment variable of the
   * agent), `setup` (the revision build only) or `proxy` (the agent sees a stand-in; the egress
   * proxy sends the value to `hosts` only, in their credential headers and in `headers`).
   * `expiresAt` (a future ISO 8601 time): past it they are no longer injected, then deleted.
   */
  async set(
    agent: string,
    secrets: Record<string, string>,
    options: RequestOptions & {
      scope?: SecretScope | undefined
      hosts?: string[] | undefined
      headers?: string[] | undefined
      expiresAt?: string | null | undefined
    } = {},
  ): Promise<SecretList> {
    const { scope, hosts, headers, expiresAt, ...request } = options
    return asSecretList(
      await this.http.json({
        method: 'PUT',
        path: path(agent),
        json: { secrets, scope, hosts, headers, expiresAt },
        ...request,
      }),
    )
  }

  async delete(agent: string, name: string, options: RequestOptions = {}): Promise<void> {
    await this.http.json({ method: 'DELETE', path: path(agent, `/${encodeURIComponent(name)}`), ...options })
  }
}
