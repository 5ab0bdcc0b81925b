import { type ChildProcess, execFileSync, type SpawnOptions, spawn } from 'node:child_process'

const ip = (...args: string[]) => execFileSync('ip', args, { stdio: 'pipe' })

/** A test host in a network namespace of its own, reachable from the host over a veth pair. */
export interface NetnsHost {
  ns: string
  /** The host's end of the veth pair (a private address the egress proxy must refuse). */
  hostSide: string
  /** The test host's address inside its namespace. */
  address: string
  /** Starts `argv` inside the namespace. */
  spawn(argv: string[], options?: SpawnOptions): ChildProcess
  /** Deletes the veth pair and the namespace (what runs inside must be stopped first). */
  remove(): void
}

/** The two ends of the /30 link `createNetnsHost(…, subnet)` makes (known before it exists). */
export function netnsAddresses(subnet: number): { hostSide: string; address: string } {
  const octet = 100 + (process.pid % 100)
  return { hostSide: `10.${subnet}.${octet}.1`, address: `10.${subnet}.${octet}.2` }
}

/**
 * Creates the namespace `cairn-<tag>-<pid>` with a /30 link to the host. Each test file passes its
 * own `subnet` (the second octet of 10.x.y.0), so files running side by side never share a route.
 */
export function createNetnsHost(tag: string, subnet: number): NetnsHost {
  const ns = `cairn-${tag}-${process.pid}`
  const { hostSide, address } = netnsAddresses(subnet)
  const veth = `c${tag.slice(0, 3)}${process.pid % 100000}`
  ip('netns', 'add', ns)
  ip('link', 'add', veth, 'type', 'veth', 'peer', 'name', `${veth}p`)
  ip('link', 'set', `${veth}p`, 'netns', ns)
  ip('addr', 'add', `${hostSide}/30`, 'dev', veth)
  ip('link', 'set', veth, 'up')
  ip('-n', ns, 'addr', 'add', `${address}/30`, 'dev', `${veth}p`)
  ip('-n', ns, 'link', 'set', `${veth}p`, 'up')
  ip('-n', ns, 'link', 'set', 'lo', 'up')
  return {
    ns,
    hostSide,
    address,
    spawn: (argv, options = {}) => spawn('ip', ['netns', 'exec', ns, ...argv], options),
    remove: () => {
      try {
        ip('link', 'del', veth)
      } catch {}
      try {
        ip('netns', 'del', ns)
      } catch {}
    },
  }
}

/**
 * Serves `dir` over plain HTTP on `port` inside the test host's namespace, and waits (up to 5 s)
 * until `probePath` answers from the host.
 */
export async function serveDirectory(
  host: NetnsHost,
  dir: string,
  probePath: string,
  port = 8080,
): Promise<ChildProcess> {
  const server = host.spawn(
    ['python3', '-m', 'http.server', String(port), '--bind', host.address, '--directory', dir],
    { stdio: 'ignore' },
  )
  for (let i = 0; i < 50; i++) {
    try {
      execFileSync('python3', [
        '-c',
        `import urllib.request; urllib.request.urlopen("http://${host.address}:${port}/${probePath}", timeout=1)`,
      ])
      break
    } catch {
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  return server
}
