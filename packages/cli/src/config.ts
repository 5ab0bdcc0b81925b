import { DEFAULT_BASE_URL } from '@cairn/sdk'
import type { Credentials } from './credentials.js'

export type Source = 'flag' | 'env' | 'credentials' | 'default' | 'none'

export interface ApiConfig {
  apiUrl: string
  apiKey: string | undefined
  urlSource: Source
  keySource: Source
}

/** Flags, then CAIRN_API_URL / CAIRN_API_KEY, then the credentials file, then the default URL. */
export function resolveApiConfig(
  flags: { apiUrl?: string | undefined; apiKey?: string | undefined },
  env: NodeJS.ProcessEnv,
  credentials: Credentials | undefined,
): ApiConfig {
  const pick = (flag: string | undefined, fromEnv: string | undefined, saved: string | undefined) =>
    flag
      ? { value: flag, source: 'flag' as const }
      : fromEnv
        ? { value: fromEnv, source: 'env' as const }
        : saved
          ? { value: saved, source: 'credentials' as const }
          : undefined
  const url = pick(flags.apiUrl, env.CAIRN_API_URL, credentials?.apiUrl)
  const key = pick(flags.apiKey, env.CAIRN_API_KEY, credentials?.apiKey)
  return {
    apiUrl: (url?.value ?? DEFAULT_BASE_URL).replace(/\/+$/, ''),
    apiKey: key?.value,
    urlSource: url?.source ?? 'default',
    keySource: key?.source ?? 'none',
  }
}
