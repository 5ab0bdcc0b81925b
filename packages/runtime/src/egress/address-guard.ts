import os from 'node:os'
import ipaddr from 'ipaddr.js'

type Address = ipaddr.IPv4 | ipaddr.IPv6

/**
 * The address `text` spells, in its one canonical form (the form the proxy connects to), or
 * undefined when it is no address. Every spelling counts: IPv4 as inet_aton reads it (`127.1`,
 * `0x7f.1`, `2130706433`, `017700000001`), IPv6 in any compression, and an IPv4-mapped IPv6
 * address (`::ffff:127.0.0.1`, `0::ffff:7f00:1`) is the IPv4 address it maps.
 */
export function canonicalAddress(text: string): string | undefined {
  const address = parse(text)
  return address === undefined ? undefined : address.toString()
}

function parse(text: string): Address | undefined {
  const bare = text.trim().replace(/^\[(.*)\]$/, '$1')
  if (!ipaddr.isValid(bare)) return undefined
  try {
    const address = ipaddr.parse(bare)
    return address.kind() === 'ipv6' && (address as ipaddr.IPv6).isIPv4MappedAddress()
      ? (address as ipaddr.IPv6).toIPv4Address()
      : address
  } catch {
    return undefined
  }
}

/** The addresses of this host's interfaces, read afresh: addresses come and go (DHCP, VPNs). */
export function hostAddresses(): Set<string> {
  const out = new Set<string>()
  for (const infos of Object.values(os.networkInterfaces())) {
    for (const info of infos ?? []) {
      const address = canonicalAddress(info.address)
      if (address) out.add(address)
    }
  }
  return out
}

/**
 * The documentation ranges (RFC 5737: TEST-NET-1/2/3). ipaddr.js files them under `reserved`, but
 * they name no part of this host or its private networks: sealed networks (this project's own CI
 * among them) route them as the outside world, e.g. a package registry's mirror. The host's own
 * addresses in them are still refused by the interface check.
 */
const DOCUMENTATION_V4 = ['192.0.2.0/24', '198.51.100.0/24', '203.0.113.0/24'].map((cidr) =>
  ipaddr.IPv4.parseCIDR(cidr),
)

/** IPv4: only global unicast (ipaddr.js's `unicast`, i.e. none of its special-purpose ranges) and the documentation ranges. */
function v4Reason(address: ipaddr.IPv4, own: ReadonlySet<string>): string | undefined {
  const range = address.range()
  const documentation = range === 'reserved' && DOCUMENTATION_V4.some((cidr) => address.match(cidr))
  if (range !== 'unicast' && !documentation) return `${address} is not a public address (${range})`
  if (own.has(address.toString())) return `${address} is an address of this host`
  return undefined
}

const NAT64_WELL_KNOWN = ipaddr.parse('64:ff9b::') as ipaddr.IPv6
const GLOBAL_UNICAST = ipaddr.parse('2000::') as ipaddr.IPv6

function v4From(high: number | undefined, low: number | undefined): ipaddr.IPv4 {
  const h = high ?? 0
  const l = low ?? 0
  return new ipaddr.IPv4([h >> 8, h & 0xff, l >> 8, l & 0xff])
}

/**
 * IPv6: only global unicast (2000::/3, none of ipaddr.js's special ranges), and the forms that
 * carry an IPv4 address (NAT64 64:ff9b::/96, 6to4, Teredo) only when that address may be reached.
 * Everything else (loopback, unspecified, IPv4-compatible ::/96, IPv4-translated, unique-local,
 * link-local, site-local, multicast, documentation, local-use NAT64…) is refused.
 */
function v6Reason(address: ipaddr.IPv6, own: ReadonlySet<string>): string | undefined {
  if (own.has(address.toString())) return `${address} is an address of this host`
  const parts = address.parts
  const range = address.range()
  const embedded = (v4: ipaddr.IPv4, what: string) => {
    const reason = v4Reason(v4, own)
    return reason ? `${address} is ${what} of ${v4}, and ${reason}` : undefined
  }
  if (range === 'rfc6052' && address.match(NAT64_WELL_KNOWN, 96))
    return embedded(v4From(parts[6], parts[7]), 'the NAT64 form')
  if (range === '6to4') return embedded(v4From(parts[1], parts[2]), 'the 6to4 form')
  if (range === 'teredo') {
    // RFC 4380 4: the server's address in bits 32-63, the client's inverted in the last 32 bits.
    return (
      embedded(v4From(parts[2], parts[3]), 'a Teredo address of the server') ??
      embedded(v4From((parts[6] ?? 0) ^ 0xffff, (parts[7] ?? 0) ^ 0xffff), 'a Teredo address of the client')
    )
  }
  if (range !== 'unicast' || !address.match(GLOBAL_UNICAST, 3))
    return `${address} is not a public address (${range === 'unicast' ? 'reserved' : range})`
  return undefined
}

/**
 * Why a sandbox may not connect to `address` (any spelling), or undefined when it may: whatever
 * is not a public unicast address (loopback, private, link-local, metadata, reserved, multicast…),
 * and every address of this host's own interfaces, unless the operator made it an exception.
 * Judged on the address the proxy connects to, never on a name (a name may resolve anywhere).
 */
export function forbiddenReason(
  address: string,
  exceptions: ReadonlySet<string> = new Set(),
  ownAddresses?: ReadonlySet<string>,
): string | undefined {
  const parsed = parse(address)
  if (parsed === undefined) return `${address} is not an IP address`
  const canonical = parsed.toString()
  for (const exception of exceptions) if (canonicalAddress(exception) === canonical) return undefined
  const own = ownAddresses ? canonicalSet(ownAddresses) : hostAddresses()
  const reason =
    parsed.kind() === 'ipv4' ? v4Reason(parsed as ipaddr.IPv4, own) : v6Reason(parsed as ipaddr.IPv6, own)
  return reason && canonical !== address ? `${address} (${reason})` : reason
}

function canonicalSet(addresses: ReadonlySet<string>): Set<string> {
  const out = new Set<string>()
  for (const address of addresses) {
    const canonical = canonicalAddress(address)
    if (canonical) out.add(canonical)
  }
  return out
}

/** `cidr` (`10.0.0.0/8`, `::1/128`) when it is a valid CIDR range, in canonical form; else undefined. */
export function canonicalCidr(cidr: string): string | undefined {
  try {
    const [address, bits] = ipaddr.parseCIDR(cidr.trim())
    return `${address.toString()}/${bits}`
  } catch {
    return undefined
  }
}

/** Whether `address` (any spelling; IPv4-mapped IPv6 as its IPv4) lies in one of `cidrs`. */
export function inCidrs(address: string, cidrs: readonly string[]): boolean {
  const parsed = parse(address)
  if (parsed === undefined) return false
  return cidrs.some((cidr) => {
    try {
      const range = ipaddr.parseCIDR(cidr)
      return range[0].kind() === parsed.kind() && parsed.match(range)
    } catch {
      return false
    }
  })
}
