import { execFileSync } from 'node:child_process'

const ip = (...args: string[]) => execFileSync('ip', args, { stdio: 'pipe' }).toString()
const nft = (ns: string, script: string) =>
  execFileSync('ip', ['netns', 'exec', ns, 'nft', '-f', '-'], { input: script, stdio: 'pipe' })

/** Second octet of the cluster test range 10.<CLUSTER_OCTET>.<run>.0/24 (other test files use 226-240). */
const CLUSTER_OCTET = 241
const PARTITION_TABLE = 'cairn_test_partition'

/**
 * The /24 a run of the cluster harness owns, claimed by adding its blackhole route in the root
 * namespace (the add fails when another run holds it, so two runs never share a range). The
 * blackhole is what a cut link falls back to: a node's address whose veth is gone is unreachable
 * at once instead of leaking out of the default route.
 */
export interface TestRange {
  /** `10.241.<run>.0/24` */
  cidr: string
  /** The address `offset` in the range. */
  address(offset: number): string
  /** Deletes the blackhole route. */
  release(): void
}

export function claimTestRange(): TestRange {
  for (let attempt = 0; attempt < 256; attempt++) {
    const third = (process.pid + attempt) % 256
    const cidr = `10.${CLUSTER_OCTET}.${third}.0/24`
    try {
      ip('route', 'add', 'blackhole', cidr)
    } catch {
      continue // held by another run (or a leftover of a crashed one, which its prefix cleanup removes)
    }
    return {
      cidr,
      address: (offset) => `10.${CLUSTER_OCTET}.${third}.${offset}`,
      release: () => {
        try {
          ip('route', 'del', 'blackhole', cidr)
        } catch {}
      },
    }
  }
  throw new Error(`no free /24 in 10.${CLUSTER_OCTET}.0.0/16 for the cluster test range`)
}

/**
 * A node's network: the namespace `<prefix>-<name>` with a /30 veth link to the root namespace.
 * Nothing else is routed from inside (no default route): the node reaches the root namespace's
 * end of its link (`hostSide`, where the test PostgreSQL listens) and is reached at `address`.
 */
export class NodeNetwork {
  private constructor(
    readonly ns: string,
    readonly veth: string,
    readonly hostSide: string,
    readonly address: string,
  ) {}

  /** `index` from 0: the link is the /30 at 4 × (index + 1) in the range. */
  static create(prefix: string, name: string, range: TestRange, index: number): NodeNetwork {
    const base = 4 * (index + 1)
    const ns = `${prefix}-${name}`
    // Interface names are at most 15 bytes: c<pid><name>, its peer with a trailing p.
    const veth = `c${process.pid}${name}`.slice(0, 14)
    const network = new NodeNetwork(ns, veth, range.address(base + 1), range.address(base + 2))
    ip('netns', 'add', ns)
    try {
      ip('link', 'add', veth, 'type', 'veth', 'peer', 'name', `${veth}p`)
      ip('link', 'set', `${veth}p`, 'netns', ns)
      ip('addr', 'add', `${network.hostSide}/30`, 'dev', veth)
      ip('link', 'set', veth, 'up')
      ip('-n', ns, 'addr', 'add', `${network.address}/30`, 'dev', `${veth}p`)
      ip('-n', ns, 'link', 'set', `${veth}p`, 'up')
      ip('-n', ns, 'link', 'set', 'lo', 'up')
    } catch (error) {
      network.remove()
      throw error
    }
    return network
  }

  /** The path `nsenter --net=` takes (only the network namespace: mounts and /sys stay the host's). */
  get nsPath(): string {
    return `/run/netns/${this.ns}`
  }

  /** argv that runs `argv` inside the namespace. */
  wrap(argv: string[]): string[] {
    return ['nsenter', `--net=${this.nsPath}`, '--', ...argv]
  }

  /**
   * Cuts the node off from `host:port` both ways (nftables in the node's namespace, packets
   * dropped, so connections hang as on a real partition instead of being refused).
   */
  partition(host: string, port: number): void {
    nft(
      this.ns,
      [
        `table inet ${PARTITION_TABLE} {`,
        '  chain output { type filter hook output priority 0; policy accept;',
        `    ip daddr ${host} tcp dport ${port} drop`,
        '  }',
        '  chain input { type filter hook input priority 0; policy accept;',
        `    ip saddr ${host} tcp sport ${port} drop`,
        '  }',
        '}',
        '',
      ].join('\n'),
    )
  }

  /** Removes the partition (no-op without one). */
  heal(): void {
    try {
      execFileSync('ip', ['netns', 'exec', this.ns, 'nft', 'delete', 'table', 'inet', PARTITION_TABLE], {
        stdio: 'pipe',
      })
    } catch {}
  }

  /** Whether a partition is in place. */
  partitioned(): boolean {
    try {
      execFileSync('ip', ['netns', 'exec', this.ns, 'nft', 'list', 'table', 'inet', PARTITION_TABLE], {
        stdio: 'pipe',
      })
      return true
    } catch {
      return false
    }
  }

  /** Cuts the link itself (the root end goes down: its /30 route goes, the blackhole answers). */
  cutLink(): void {
    ip('link', 'set', this.veth, 'down')
  }

  restoreLink(): void {
    ip('link', 'set', this.veth, 'up')
  }

  /** Deletes the veth pair (and with it the partition table) and the namespace. */
  remove(): void {
    this.heal()
    try {
      ip('link', 'del', this.veth)
    } catch {}
    try {
      ip('netns', 'del', this.ns)
    } catch {}
  }
}

/** How the root namespace routes `address` now (`ip route get`), e.g. `blackhole …` or `… dev eth0`. */
export function routeTo(address: string): string {
  try {
    return ip('route', 'get', address).trim()
  } catch (error) {
    return `error: ${(error as { stderr?: Buffer }).stderr?.toString().trim() ?? String(error)}`
  }
}
