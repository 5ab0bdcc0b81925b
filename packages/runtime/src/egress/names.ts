import { promises as dns } from 'node:dns'
import { readFile } from 'node:fs/promises'
import net from 'node:net'

/**
 * The one spelling of a host name every egress decision reads (allowlist, operator's map, hosts
 * file, DNS, secret bindings, first bytes): lowercase, without trailing dots (`Svc.Internal.` is
 * `svc.internal`), an IPv6 address without its brackets.
 */
export function egressName(host: string): string {
  return host
    .trim()
    .replace(/^\[(.*)\]$/, '$1')
    .toLowerCase()
    .replace(/\.+$/, '')
}

/** How a sandbox's name lookups are bounded (each sandbox has its own `NameResolver`). */
export interface LookupLimits {
  /** Lookups of one sandbox in flight at once; more wait for a slot (within their timeout). */
  maxLookups: number
  /** A lookup not answered this long after it was asked (waiting included) fails. */
  lookupTimeoutMs: number
  /** DNS servers (`addr` or `addr:port`) asked instead of /etc/resolv.conf's. */
  dnsServers?: readonly string[] | undefined
}

export const DEFAULT_LOOKUP_LIMITS: LookupLimits = { maxLookups: 8, lookupTimeoutMs: 5_000 }

export const HOSTS_FILE = '/etc/hosts'
/** How long a read of the hosts file is used before it is read again. */
const HOSTS_FILE_TTL_MS = 2_000
let hostsFile: { readAtMs: number; names: Map<string, string[]> } | undefined

/** /etc/hosts as name → addresses (every name and alias of a line; first lines first). */
export function parseHostsFile(text: string): Map<string, string[]> {
  const names = new Map<string, string[]>()
  for (const line of text.split('\n')) {
    const [address, ...aliases] = (line.split('#')[0] ?? '').trim().split(/\s+/)
    if (!address || net.isIP(address) === 0) continue
    for (const alias of aliases) {
      const name = egressName(alias)
      names.set(name, [...(names.get(name) ?? []), address])
    }
  }
  return names
}

async function hostsFileNames(): Promise<Map<string, string[]>> {
  const now = Date.now()
  if (hostsFile && now - hostsFile.readAtMs < HOSTS_FILE_TTL_MS) return hostsFile.names
  const text = await readFile(HOSTS_FILE, 'utf8').catch(() => '')
  hostsFile = { readAtMs: now, names: parseHostsFile(text) }
  return hostsFile.names
}

/** Why a lookup failed, in words for the sandbox's network log. */
export class LookupError extends Error {}

/**
 * One sandbox's name lookups: the operator's map, then /etc/hosts, then DNS through a c-ares
 * resolver of its own. Unlike `dns.lookup` (getaddrinfo on libuv's four threads, shared by every
 * sandbox and the server's file I/O), a query waits on a socket, not a thread, so names that
 * never answer cannot hold up another sandbox's lookups; and each sandbox's are capped in number
 * and time. DNS answers are read as they are: no search domains (unqualified names go through
 * the operator's map or /etc/hosts).
 */
export class NameResolver {
  private readonly resolver: dns.Resolver
  /** The operator's map, its names spelled as `egressName` spells them. */
  private readonly hosts = new Map<string, readonly string[]>()
  private inFlight = 0
  private readonly waiting: (() => void)[] = []

  constructor(
    hosts: ReadonlyMap<string, readonly string[]> | undefined,
    private readonly limits: LookupLimits = DEFAULT_LOOKUP_LIMITS,
  ) {
    for (const [name, addresses] of hosts ?? []) {
      const key = egressName(name)
      this.hosts.set(key, [...(this.hosts.get(key) ?? []), ...addresses])
    }
    // Two tries of a third of the timeout each (c-ares doubles the second): within the timeout.
    this.resolver = new dns.Resolver({
      timeout: Math.max(1, Math.floor(limits.lookupTimeoutMs / 3)),
      tries: 2,
    })
    if (limits.dnsServers && limits.dnsServers.length > 0) this.resolver.setServers([...limits.dnsServers])
  }

  /** The addresses of `name` (normalised with `egressName`), or a `LookupError`. */
  async addresses(name: string): Promise<string[]> {
    const mapped = this.hosts.get(name) ?? (await hostsFileNames()).get(name)
    if (mapped) return [...mapped]
    const deadline = Date.now() + this.limits.lookupTimeoutMs
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new LookupError(`no answer for ${name} within ${this.limits.lookupTimeoutMs} ms`)),
        this.limits.lookupTimeoutMs,
      )
    })
    try {
      return await Promise.race([this.query(name, deadline), timeout])
    } finally {
      clearTimeout(timer)
    }
  }

  /** Waits for a slot (until `deadline`), then asks DNS for both families. */
  private async query(name: string, deadline: number): Promise<string[]> {
    while (this.inFlight >= this.limits.maxLookups) {
      await new Promise<void>((resolve) => this.waiting.push(resolve))
      if (Date.now() >= deadline) {
        // Its turn came too late: the turn goes to the next in line.
        this.waiting.shift()?.()
        throw new LookupError(`no lookup slot for ${name}`)
      }
    }
    this.inFlight++
    try {
      const [v4, v6] = await Promise.allSettled([this.resolver.resolve4(name), this.resolver.resolve6(name)])
      const found = [
        ...(v4.status === 'fulfilled' ? v4.value : []),
        ...(v6.status === 'fulfilled' ? v6.value : []),
      ]
      if (found.length > 0) return found
      const reason = v4.status === 'rejected' ? (v4.reason as NodeJS.ErrnoException).code : undefined
      throw new LookupError(`cannot resolve ${name}${reason ? ` (${reason})` : ''}`)
    } finally {
      this.inFlight--
      this.waiting.shift()?.()
    }
  }

  /** Ends every query still waiting on DNS. */
  close(): void {
    this.resolver.cancel()
  }
}
