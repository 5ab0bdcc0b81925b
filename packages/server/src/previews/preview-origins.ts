import { isIP } from 'node:net'
import { CairnProblem } from '@cairn/protocol'

export const DEFAULT_PREVIEW_DOMAIN = 'localhost'

const SESSION_PREFIX = 'ses_'
const HOST_SESSION_PREFIX = 'ses-'
const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/

/**
 * Where previews are served: each session port on an origin of its own, `<port>-ses-<id>.<domain>`
 * on the preview listener, so no preview shares an origin (storage, cookies, service workers) with
 * the console or with another preview. Browsers resolve `*.localhost` to loopback on their own; any
 * other domain needs a wildcard DNS record pointing at the preview listener.
 */
export class PreviewOrigins {
  readonly domain: string

  constructor(
    domain: string,
    /** The preview listener's port as browsers reach it. */
    readonly port: number,
    readonly protocol: 'http' | 'https' = 'http',
  ) {
    this.domain = checkPreviewDomain(domain)
  }

  /** `<port>-ses-<id>.<domain>`: a DNS label with no underscore (wildcard certificates refuse them). */
  hostOf(sessionId: string, port: number): string {
    return `${port}-${HOST_SESSION_PREFIX}${sessionId.slice(SESSION_PREFIX.length)}.${this.domain}`
  }

  originOf(sessionId: string, port: number): string {
    const standard =
      (this.protocol === 'http' && this.port === 80) || (this.protocol === 'https' && this.port === 443)
    return `${this.protocol}://${this.hostOf(sessionId, port)}${standard ? '' : `:${this.port}`}`
  }
}

/** The session and port a preview listener's `Host` names, if it names one under `domain`. */
export function previewOfHost(
  host: string | undefined,
  domain: string,
): { sessionId: string; port: number } | undefined {
  if (!host) return undefined
  const name = host
    .toLowerCase()
    .replace(/:\d{1,5}$/, '')
    .replace(/\.$/, '')
  const suffix = `.${domain}`
  if (!name.endsWith(suffix)) return undefined
  const match = /^(\d{1,5})-ses-([0-9a-z]+)$/.exec(name.slice(0, -suffix.length))
  if (!match?.[1] || !match[2]) return undefined
  const port = Number(match[1])
  if (port < 1 || port > 65535 || String(port) !== match[1]) return undefined
  return { sessionId: `${SESSION_PREFIX}${match[2]}`, port }
}

/** A lower-case DNS name (not an address: previews need names under it). */
export function checkPreviewDomain(domain: string): string {
  const name = domain.toLowerCase().replace(/\.$/, '')
  if (isIP(name) !== 0 || name.split('.').some((label) => !LABEL.test(label))) {
    throw new CairnProblem(
      'validation_failed',
      `the preview domain must be a DNS name whose subdomains reach the preview listener (default ${DEFAULT_PREVIEW_DOMAIN}), not '${domain}'`,
    )
  }
  return name
}
