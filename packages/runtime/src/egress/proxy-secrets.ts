import type http from 'node:http'
import { decide } from './policy.js'

/** A `proxy`-scoped secret as the egress proxy holds it: the agent only ever sees `standIn`. */
export interface ProxySecret {
  name: string
  /** The token in the agent's environment; replaced by `value` on the way to a bound host. */
  standIn: string
  value: string
  /** Hosts in allowlist syntax (`api.example.com`, `*.example.com`, `host:8443`). */
  hosts: readonly string[]
}

/** The secrets bound to a host and port, by the same matching rules as the allowlist. */
export function secretsBoundTo(secrets: readonly ProxySecret[], host: string, port: number): ProxySecret[] {
  return secrets.filter((secret) => decide({ allow: secret.hosts }, host, port).allowed)
}

function replaceAll(text: string, from: string, to: string): string {
  return from.length > 0 && text.includes(from) ? text.split(from).join(to) : text
}

/**
 * Request headers with every stand-in replaced by its real value: `Authorization: Bearer <stand-in>`,
 * `x-api-key: <stand-in>`, or any other header that carries it. Also names the secrets used.
 */
export function swapInSecrets(
  headers: http.IncomingHttpHeaders,
  secrets: readonly ProxySecret[],
): { headers: http.OutgoingHttpHeaders; used: string[] } {
  const used = new Set<string>()
  const swap = (value: string) => {
    let out = value
    for (const secret of secrets) {
      const next = replaceAll(out, secret.standIn, secret.value)
      if (next !== out) used.add(secret.name)
      out = next
    }
    return out
  }
  const out: http.OutgoingHttpHeaders = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue
    out[name] = Array.isArray(value) ? value.map(swap) : swap(value)
  }
  return { headers: out, used: [...used] }
}

/** Response headers with any real value an upstream echoes turned back into its stand-in. */
export function swapOutSecrets(
  headers: http.IncomingHttpHeaders,
  secrets: readonly ProxySecret[],
): http.OutgoingHttpHeaders {
  const back = (value: string) =>
    secrets.reduce((text, secret) => replaceAll(text, secret.value, secret.standIn), value)
  const out: http.OutgoingHttpHeaders = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue
    out[name] = Array.isArray(value) ? value.map(back) : back(value)
  }
  return out
}
