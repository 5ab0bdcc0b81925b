import { egressName } from './names.js'

/** One allowlist entry: `api.example.com`, `*.example.com`, `host:8443`, or `{host, methods}`. */
export type EgressRule = string | { host: string; methods?: string[] | undefined }

export interface EgressPolicy {
  allow: readonly EgressRule[]
}

export interface EgressDecision {
  allowed: boolean
  reason: string
}

const DEFAULT_PORTS = new Set([80, 443])

function splitHostPort(pattern: string): { host: string; port: number | undefined } {
  // An IPv6 address, in brackets when a port follows: `[::1]:8443`.
  const bracketed = /^\[([^\]]+)\](?::(\d+))?$/.exec(pattern.trim().toLowerCase())
  if (bracketed) return { host: bracketed[1] ?? '', port: bracketed[2] ? Number(bracketed[2]) : undefined }
  const match = /^(.*?)(?::(\d+))?$/.exec(pattern.trim().toLowerCase())
  return { host: match?.[1] ?? '', port: match?.[2] ? Number(match[2]) : undefined }
}

function hostMatches(pattern: string, host: string): boolean {
  if (pattern === host) return true
  if (pattern.startsWith('*.')) return host.endsWith(pattern.slice(1)) && host.length > pattern.length - 1
  return false
}

/** Default deny: a connection is allowed only when a rule names its host, port and method. */
export function decide(policy: EgressPolicy, host: string, port: number, method?: string): EgressDecision {
  const wanted = egressName(host)
  for (const rule of policy.allow) {
    const spec = typeof rule === 'string' ? { host: rule, methods: undefined } : rule
    const { host: patternHost, port: rulePort } = splitHostPort(spec.host)
    if (!hostMatches(egressName(patternHost), wanted)) continue
    if (rulePort !== undefined ? rulePort !== port : !DEFAULT_PORTS.has(port)) continue
    if (method && spec.methods && !spec.methods.map((m) => m.toUpperCase()).includes(method.toUpperCase())) {
      return { allowed: false, reason: `method ${method} is not allowed for ${host}` }
    }
    return { allowed: true, reason: `allowed by ${typeof rule === 'string' ? rule : rule.host}` }
  }
  return { allowed: false, reason: `${host}:${port} is not in the allowlist` }
}

function portsOf(port: number | undefined): number[] {
  return port !== undefined ? [port] : [...DEFAULT_PORTS]
}

/**
 * Whether the policy lets any connection through that a proxy secret bound to `binding`
 * (allowlist syntax) would be sent on: the bound host itself is allowed, or, for a wildcard
 * binding, a host the allowlist names falls under it. Both ways are `decide`, so a binding is
 * judged exactly as the proxy will judge its connections.
 */
export function bindingAllowed(policy: EgressPolicy, binding: string): boolean {
  const bound = splitHostPort(binding)
  if (portsOf(bound.port).some((port) => decide(policy, bound.host, port).allowed)) return true
  const asPolicy = { allow: [binding] }
  return policy.allow.some((rule) => {
    const allowed = splitHostPort(typeof rule === 'string' ? rule : rule.host)
    return portsOf(allowed.port).some((port) => decide(asPolicy, allowed.host, port).allowed)
  })
}
