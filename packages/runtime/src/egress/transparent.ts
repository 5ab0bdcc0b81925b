import { existsSync } from 'node:fs'
import type { EgressPolicy } from './policy.js'

/** The in-sandbox forwarder's explicit proxy (`HTTP(S)_PROXY`). */
export const EXPLICIT_PROXY_PORT = 3128
/** Where the in-sandbox forwarder (`forward.py`) takes redirected TCP connections. */
export const TRANSPARENT_PORT = 3129
/** Where its stub DNS server listens (UDP and TCP); port 53 is redirected there. */
export const DNS_PORT = 3153
/** The ports the forwarder holds inside a sandbox with an allowlist: Cairn's, not the agent's. */
export const FORWARDER_PORTS: ReadonlySet<number> = new Set([EXPLICIT_PROXY_PORT, TRANSPARENT_PORT, DNS_PORT])
/** The nameserver in every sandbox's /etc/resolv.conf: any address off loopback reaches the stub. */
export const STUB_NAMESERVER = '198.18.0.1'
/**
 * The sandbox's own address, on its loopback: a real source address, so the answers of the
 * redirected DNS queries come back from the nameserver's address (the resolver checks that).
 */
export const SANDBOX_ADDRESS = '198.18.0.2'

const NFT_PATHS = ['/usr/sbin/nft', '/sbin/nft']

/** Whether nftables is installed (`scripts/install-system-deps.sh`); without it egress stays explicit. */
export function nftAvailable(): boolean {
  return NFT_PATHS.some((p) => existsSync(p))
}

/**
 * Run as root in a fresh network namespace (`unshare --net`) before it execs the sandbox: loopback
 * up, a default route (so a connect() to any address reaches the output hook instead of failing
 * with ENETUNREACH), and one nft table sending DNS to the stub and every other TCP connection not
 * to loopback to the forwarder. The namespace has no interface to anywhere: these rules only pick
 * which forwarder port a connection lands on. It dies with the sandbox's last process, so nothing
 * is left to clean up. Four short execs (unshare, sh, ip, nft): a few ms on a cold start.
 */
export const NETNS_SETUP = `ip -batch - <<'IP' && nft -f - <<'NFT' && exec "$@"
link set lo up
addr add ${SANDBOX_ADDRESS}/32 dev lo
route add default dev lo src ${SANDBOX_ADDRESS}
IP
table ip cairn_egress {
  chain output {
    type nat hook output priority -100; policy accept;
    ip daddr 127.0.0.0/8 return
    meta l4proto { tcp, udp } th dport 53 redirect to :${DNS_PORT}
    meta l4proto tcp redirect to :${TRANSPARENT_PORT}
  }
}
NFT`

/**
 * The names the stub DNS server answers (with addresses the forwarder maps back to the name): the
 * allowlist's host patterns without ports and methods. IP literals need no answer.
 */
export function dnsPatterns(policy: EgressPolicy): string[] {
  const names = new Set<string>()
  for (const rule of policy.allow) {
    const host = (typeof rule === 'string' ? rule : rule.host).trim().toLowerCase()
    const name = host.replace(/:\d+$/, '').replace(/\.$/, '')
    if (!name || /^[\d.]+$/.test(name) || name.includes(':') || name.includes('[')) continue
    names.add(name)
  }
  return [...names]
}

/** The forwarder's command line: transparent mode when the driver redirects the sandbox's traffic. */
export function forwarderCommand(
  command: readonly string[],
  transparent: boolean,
  policy: EgressPolicy,
): string[] {
  const options = transparent ? ['--transparent', dnsPatterns(policy).join(',')] : []
  return ['python3', '/opt/cairn/egress/forward.py', ...options, '--', ...command]
}
