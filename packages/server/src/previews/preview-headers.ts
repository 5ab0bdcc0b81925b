import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http'
import { PREVIEW_COOKIE } from './preview-signer.js'

// Connection-level headers are the proxy's own on each side; they are not forwarded.
export const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
])

/**
 * Response headers of a preview that would reach past its own origin: `Service-Worker-Allowed`
 * widens a worker's scope beyond its script's directory, and the policies below are Cairn's, not
 * the service's, to choose.
 */
const DROPPED = new Set(['service-worker-allowed', 'cross-origin-opener-policy', 'origin-agent-cluster'])

/**
 * Set on every preview response (and Upgrade handshake). COOP severs the opener link between a
 * preview and a page of another origin that opened it (the console cannot be navigated or named
 * from a preview tab), while a preview keeps the popups it opens (OAuth flows); Origin-Agent-Cluster
 * keeps `document.domain` from relaxing the origin.
 */
export const FORCED: Readonly<Record<string, string>> = {
  'cross-origin-opener-policy': 'same-origin-allow-popups',
  'origin-agent-cluster': '?1',
}

/** What the service sees of the request: no API key, no preview cookie, its own Host. */
export function upstreamHeaders(
  headers: IncomingHttpHeaders,
  port: number,
  upgrade: boolean,
): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || name === 'authorization' || name === 'cookie' || name === 'host') continue
    if (name.startsWith('x-forwarded-')) continue
    if (HOP_BY_HOP.has(name) && !(upgrade && (name === 'connection' || name === 'upgrade'))) continue
    out[name] = value
  }
  const cookie = withoutPreviewCookie(headers.cookie)
  if (cookie) out.cookie = cookie
  out.host = `localhost:${port}`
  if (headers.host) out['x-forwarded-host'] = headers.host
  out['x-forwarded-proto'] = 'http'
  return out
}

/**
 * What the browser sees of the service's answer (or of an Upgrade's handshake): hop-by-hop and scope-widening headers dropped,
 * cookies kept to the preview's own host (no `Domain`) and never Cairn's own, the forced policies
 * added, and `ownCookie` (a signed URL's token) appended.
 */
export function previewResponseHeaders(
  headers: IncomingHttpHeaders,
  ownCookie?: string,
  { upgrade = false } = {},
): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || DROPPED.has(name) || name === 'set-cookie') continue
    // An Upgrade's answer is relayed byte for byte: its framing headers describe those bytes.
    if (HOP_BY_HOP.has(name) && !upgrade) continue
    out[name] = value
  }
  const cookies = (headers['set-cookie'] ?? []).flatMap((c) => hostOnlyCookie(c) ?? [])
  if (ownCookie) cookies.push(ownCookie)
  if (cookies.length > 0) out['set-cookie'] = cookies
  return { ...out, ...FORCED }
}

/**
 * A `Set-Cookie` value without its `Domain` attribute (so the cookie stays on the preview's host
 * and cannot be tossed onto sibling previews or the console's host), or nothing when it would set
 * Cairn's own preview cookie.
 */
export function hostOnlyCookie(value: string): string | undefined {
  const [pair = '', ...attributes] = value.split(';')
  if (pair.split('=')[0]?.trim() === PREVIEW_COOKIE) return undefined
  const kept = attributes.filter((a) => a.split('=')[0]?.trim().toLowerCase() !== 'domain')
  return [pair, ...kept].join(';')
}

/** The request's cookies without Cairn's own (the service must not see the preview token). */
export function withoutPreviewCookie(header: string | undefined): string | undefined {
  const kept = (header ?? '')
    .split(';')
    .map((p) => p.trim())
    .filter((p) => p && !p.startsWith(`${PREVIEW_COOKIE}=`))
  return kept.length > 0 ? kept.join('; ') : undefined
}
