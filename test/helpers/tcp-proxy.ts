import net from 'node:net'

/** A TCP proxy in front of a server, whose connections a test can cut (a dropped network) or stall. */
export interface TcpProxy {
  url: string
  /** Connections made through it so far. */
  readonly connections: number
  /** Bytes its clients have sent through it to the server so far. */
  readonly bytesToServer: number
  /** Destroys every connection open now, both sides; new ones are proxied as before. */
  dropAll(): number
  /**
   * Stops forwarding, as a hung server would: the connections open now carry nothing more either
   * way, and new ones are accepted and then never answered (nothing reaches the server). Nothing is
   * closed.
   */
  hang(): void
  /** Forwards new connections again; the ones held while hung are closed (they had timed out). */
  resume(): void
  close(): Promise<void>
}

/** `listenHost`: the address it listens on (loopback; a cluster node's link to reach a loopback server). */
export async function startTcpProxy(target: string, listenHost = '127.0.0.1'): Promise<TcpProxy> {
  const { hostname, port } = new URL(target)
  const open = new Set<net.Socket>()
  const pairs = new Set<[net.Socket, net.Socket]>()
  const stalled = new Set<net.Socket>()
  let connections = 0
  let bytesToServer = 0
  let hung = false
  const track = (socket: net.Socket) => {
    open.add(socket)
    socket.on('close', () => open.delete(socket))
    socket.on('error', () => undefined)
  }
  const stall = (socket: net.Socket) => {
    socket.unpipe()
    socket.pause()
    stalled.add(socket)
  }
  const server = net.createServer((client) => {
    connections++
    track(client)
    if (hung) {
      stall(client)
      return
    }
    const upstream = net.connect(Number(port), hostname)
    track(upstream)
    const pair: [net.Socket, net.Socket] = [client, upstream]
    pairs.add(pair)
    client.on('data', (chunk: Buffer) => {
      bytesToServer += chunk.length
    })
    client.pipe(upstream)
    upstream.pipe(client)
    client.on('close', () => upstream.destroy())
    upstream.on('close', () => {
      client.destroy()
      pairs.delete(pair)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, listenHost, resolve))
  const address = server.address() as net.AddressInfo
  return {
    url: `http://${listenHost}:${address.port}`,
    get connections() {
      return connections
    },
    get bytesToServer() {
      return bytesToServer
    },
    dropAll() {
      const count = open.size
      for (const socket of open) socket.destroy()
      return count
    },
    hang() {
      hung = true
      for (const [client, upstream] of pairs) {
        stall(client)
        stall(upstream)
      }
    },
    resume() {
      hung = false
      for (const socket of stalled) socket.destroy()
      stalled.clear()
    },
    async close() {
      for (const socket of open) socket.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
