import net from 'node:net'

/** A TCP proxy in front of a server, whose connections a test can cut (a dropped network). */
export interface TcpProxy {
  url: string
  /** Connections made through it so far. */
  readonly connections: number
  /** Destroys every connection open now, both sides; new ones are proxied as before. */
  dropAll(): number
  close(): Promise<void>
}

/** `listenHost`: the address it listens on (loopback; a cluster node's link to reach a loopback server). */
export async function startTcpProxy(target: string, listenHost = '127.0.0.1'): Promise<TcpProxy> {
  const { hostname, port } = new URL(target)
  const open = new Set<net.Socket>()
  let connections = 0
  const server = net.createServer((client) => {
    connections++
    const upstream = net.connect(Number(port), hostname)
    for (const socket of [client, upstream]) {
      open.add(socket)
      socket.on('close', () => open.delete(socket))
      socket.on('error', () => undefined)
    }
    client.pipe(upstream)
    upstream.pipe(client)
    client.on('close', () => upstream.destroy())
    upstream.on('close', () => client.destroy())
  })
  await new Promise<void>((resolve) => server.listen(0, listenHost, resolve))
  const address = server.address() as net.AddressInfo
  return {
    url: `http://${listenHost}:${address.port}`,
    get connections() {
      return connections
    },
    dropAll() {
      const count = open.size
      for (const socket of open) socket.destroy()
      return count
    },
    async close() {
      for (const socket of open) socket.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
