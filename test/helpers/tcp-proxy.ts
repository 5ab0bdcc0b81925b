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

export async function startTcpProxy(target: string): Promise<TcpProxy> {
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
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const address = server.address() as net.AddressInfo
  return {
    url: `http://127.0.0.1:${address.port}`,
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
