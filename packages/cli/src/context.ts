import type { Cairn } from '@cairn/sdk'
import type { GlobalFlags } from './argv.js'
import type { ApiConfig } from './config.js'
import type { Output } from './output.js'

export const CLI_VERSION = '0.1.0'

/** What every command gets: the global flags, the output, and the API client (built on first use). */
export class Context {
  readonly out: Output
  private config: ApiConfig | undefined
  private cached: Cairn | undefined

  constructor(
    readonly flags: GlobalFlags,
    readonly env: NodeJS.ProcessEnv,
    out: Output,
  ) {
    this.out = out
  }

  get json(): boolean {
    return this.flags.json
  }

  /** The URL in use, once known (for hints). */
  get apiUrl(): string | undefined {
    return this.config?.apiUrl
  }

  async api(): Promise<ApiConfig> {
    if (this.config) return this.config
    // The file is read only when flags and environment leave something open (a broken file then matters).
    const complete =
      (this.flags.apiUrl ?? this.env.CAIRN_API_URL) && (this.flags.apiKey ?? this.env.CAIRN_API_KEY)
    // Loaded on first use, like the client below: commands that make no request never load them.
    const [{ resolveApiConfig }, { credentialsPath, readCredentials }] = await Promise.all([
      import('./config.js'),
      import('./credentials.js'),
    ])
    const saved = complete ? undefined : await readCredentials(credentialsPath(this.env))
    this.config = resolveApiConfig(this.flags, this.env, saved)
    return this.config
  }

  async client(): Promise<Cairn> {
    if (this.cached) return this.cached
    const config = await this.api()
    const [{ Cairn }, { httpFetch }] = await Promise.all([import('@cairn/sdk'), import('./http-fetch.js')])
    this.cached = new Cairn({
      fetch: httpFetch,
      baseUrl: config.apiUrl,
      apiKey: config.apiKey,
      userAgent: `cairn-cli/${CLI_VERSION}`,
    })
    return this.cached
  }
}
