import { lookup as dnsLookup, type LookupAddress } from 'node:dns'
import { isIP } from 'node:net'
import { CairnProblem } from '@cairn/protocol'
import { canonicalAddress, forbiddenReason, hostAddresses, inCidrs } from '@cairn/runtime/port'

/**
 * Where webhooks may be sent: the egress proxy's rule (public unicast addresses only: no loopback,
 * private, link-local, metadata or reserved range, no address of this host), judged on every
 * address a name resolves to, when an endpoint is registered and again at each connection (a
 * name may resolve elsewhere later). The operator may allow ranges (`--webhook-allow-cidr`);
 * this server's own listeners on this host stay refused whatever is allowed.
 */
export class WebhookAddressGuard {
  private lookups = 0
  private readonly waiting: (() => void)[] = []

  constructor(
    private readonly allowCidrs: readonly string[],
    /** The ports this server listens on (the API, previews): set once it listens. */
    private readonly ownPorts: () => readonly number[],
  ) {}

  /** Why a webhook may not connect to `address`:`port`, or undefined when it may. */
  reason(address: string, port: number): string | undefined {
    const canonical = canonicalAddress(address) ?? address
    if (this.ownPorts().includes(port) && isThisHost(canonical))
      return `${canonical}:${port} is this server's own listener (the control plane)`
    if (inCidrs(canonical, this.allowCidrs)) return undefined
    return forbiddenReason(canonical)
  }

  /**
   * A webhook URL as registered: http(s), no credentials, every address it resolves to allowed.
   * Refused `validation_failed` (not such a URL, or its name does not resolve) or
   * `webhook_url_forbidden` (an address it may not reach).
   */
  async check(text: string): Promise<URL> {
    const url = parseWebhookUrl(text)
    const host = bareHost(url)
    const addresses = isIP(host) ? [host] : await this.resolveAll(host).catch(() => undefined)
    if (!addresses || addresses.length === 0)
      throw new CairnProblem('validation_failed', `the webhook URL's host ${host} does not resolve`, {
        url: text,
      })
    for (const address of addresses) this.refuse(url, address)
    return url
  }

  /** Throws `webhook_url_forbidden` when `url` may not be sent to at `address`. */
  refuse(url: URL, address: string): void {
    const reason = this.reason(address, portOf(url))
    if (reason)
      throw new CairnProblem('webhook_url_forbidden', `webhooks may not be sent to ${url.host}: ${reason}`, {
        url: url.href,
        address,
        reason,
      })
  }

  /**
   * The DNS lookup a delivery connects through: every address the name resolves to is checked
   * before any is used, so what is connected to is what was checked.
   */
  lookupFor(url: URL): typeof dnsLookup {
    const lookup = (
      hostname: string,
      options: { all?: boolean; family?: number | string },
      callback: (error: Error | null, address: string | LookupAddress[], family?: number) => void,
    ) => {
      this.lookupAll(hostname, Number(options.family ?? 0) || 0, (error, found) => {
        if (error) return callback(error, '')
        try {
          for (const { address } of found) this.refuse(url, address)
        } catch (refusal) {
          return callback(refusal as Error, '')
        }
        const first = found[0]
        if (options.all) callback(null, found)
        else if (first) callback(null, first.address, first.family)
        else callback(new Error(`${hostname} resolved to no address`), '')
      })
    }
    return lookup as unknown as typeof dnsLookup
  }

  private resolveAll(host: string): Promise<string[]> {
    return new Promise((resolve, reject) =>
      this.lookupAll(host, 0, (error, found) =>
        error ? reject(error) : resolve(found.map((f) => f.address)),
      ),
    )
  }

  /**
   * `dns.lookup` with every address, at most `MAX_LOOKUPS` at once: it runs on libuv's four
   * threads, which the server's file and crypto work share, and a name whose DNS never answers
   * holds one for the resolver's whole timeout.
   */
  private lookupAll(
    host: string,
    family: number,
    callback: (error: NodeJS.ErrnoException | null, found: LookupAddress[]) => void,
  ): void {
    const run = () => {
      this.lookups++
      dnsLookup(host, { all: true, family }, (error, found) => {
        this.lookups--
        this.waiting.shift()?.()
        callback(error, found)
      })
    }
    if (this.lookups < MAX_LOOKUPS) run()
    else this.waiting.push(run)
  }
}

/** Webhook name lookups at once, per process. */
const MAX_LOOKUPS = 2

function parseWebhookUrl(text: string): URL {
  let url: URL
  try {
    url = new URL(text)
  } catch {
    throw new CairnProblem('validation_failed', `the webhook URL is not a URL: ${JSON.stringify(text)}`, {
      url: text,
    })
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new CairnProblem('validation_failed', `a webhook URL is http:// or https://, not ${url.protocol}`, {
      url: text,
    })
  if (url.username || url.password)
    throw new CairnProblem(
      'validation_failed',
      'a webhook URL carries no credentials (the signature authenticates the sender)',
      { url: text },
    )
  return url
}

/** The URL's host without IPv6 brackets. */
export function bareHost(url: URL): string {
  return url.hostname.replace(/^\[(.*)\]$/, '$1')
}

export function portOf(url: URL): number {
  return url.port ? Number(url.port) : url.protocol === 'https:' ? 443 : 80
}

/** Loopback, unspecified, or one of this host's interface addresses. */
function isThisHost(canonical: string): boolean {
  return (
    canonical.startsWith('127.') ||
    canonical === '::1' ||
    canonical === '0.0.0.0' ||
    canonical === '::' ||
    hostAddresses().has(canonical)
  )
}
