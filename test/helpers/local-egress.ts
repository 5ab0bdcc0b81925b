import { mkdtemp, rm } from 'node:fs/promises'
import type net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { EgressProxy, type EgressProxyOptions } from '../../packages/runtime/src/egress/proxy.js'

/** An egress proxy on a unix socket in a directory of its own, whose one host is an upstream on the loopback. */
export interface LocalEgress {
  dir: string
  socketPath: string
  proxy: EgressProxy
  /** The upstream's port. */
  port: number
  /** Closes the proxy and the upstream and removes the directory. */
  close(): Promise<void>
}

/**
 * Listens `upstream` on 127.0.0.1 and starts an egress proxy (its socket in a new directory named
 * from `prefix`) that allows `name` (up.test by default) on the upstream's port and resolves it
 * there; `options(port)` adds to (or replaces) the proxy's options.
 */
export async function startLocalEgress(
  upstream: net.Server,
  {
    name = 'up.test',
    prefix = 'cairn-egress-',
    options = () => ({}),
  }: { name?: string; prefix?: string; options?: (port: number) => Partial<EgressProxyOptions> } = {},
): Promise<LocalEgress> {
  const dir = await mkdtemp(path.join(os.tmpdir(), prefix))
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve))
  const port = (upstream.address() as net.AddressInfo).port
  const socketPath = path.join(dir, 'egress.sock')
  const proxy = new EgressProxy({
    socketPath,
    policy: { allow: [`${name}:${port}`] },
    privateExceptions: new Set(['127.0.0.1']),
    hosts: new Map([[name, ['127.0.0.1']]]),
    onEvent: () => undefined,
    ...options(port),
  })
  await proxy.listen()
  return {
    dir,
    socketPath,
    proxy,
    port,
    async close() {
      await proxy.close()
      upstream.close()
      await rm(dir, { recursive: true, force: true })
    },
  }
}
