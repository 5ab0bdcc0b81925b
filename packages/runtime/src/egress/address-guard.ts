import net from 'node:net'

/** IPv4 ranges a sandbox may never reach through the proxy: the host, private nets, link-local (metadata). */
const FORBIDDEN_V4: [string, number][] = [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4],
]

function v4ToInt(ip: string): number {
  return ip.split('.').reduce((acc, part) => (acc << 8) + Number(part), 0) >>> 0
}

function inV4Range(ip: string, base: string, bits: number): boolean {
  const mask = bits === 0 ? 0 : (~0 << (32 - bits)) >>> 0
  return (v4ToInt(ip) & mask) === (v4ToInt(base) & mask)
}

/** Why an address is refused, or undefined when it may be reached. */
export function forbiddenReason(
  address: string,
  exceptions: ReadonlySet<string> = new Set(),
): string | undefined {
  if (exceptions.has(address)) return undefined
  const mapped = address.toLowerCase().startsWith('::ffff:') ? address.slice(7) : address
  if (net.isIPv4(mapped)) {
    for (const [base, bits] of FORBIDDEN_V4) {
      if (inV4Range(mapped, base, bits)) return `${address} is in a private, loopback or link-local range`
    }
    return undefined
  }
  if (net.isIPv6(mapped)) {
    const lower = mapped.toLowerCase()
    if (lower === '::1' || lower === '::') return `${address} is the host`
    if (/^f[cd]/.test(lower)) return `${address} is a unique-local address`
    if (/^fe[89ab]/.test(lower)) return `${address} is link-local`
    if (/^ff/.test(lower)) return `${address} is multicast`
    return undefined
  }
  return `${address} is not an IP address`
}
