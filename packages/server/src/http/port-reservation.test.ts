import net from 'node:net'
import { describe, expect, it } from 'vitest'
import { reservePort } from './port-reservation.js'

async function freePort(): Promise<number> {
  const server = net.createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  await new Promise((resolve) => server.close(resolve))
  return port
}

describe('a port reservation', () => {
  it('lets the port go although a client connected to it meanwhile and keeps its connection open', async () => {
    const port = await freePort()
    const reservation = await reservePort(port, '127.0.0.1', '--port')
    // A client that connects while the port is reserved (a replica reaching a restarting node)
    // and never closes its end.
    const client = net.connect(port, '127.0.0.1')
    client.on('error', () => undefined)
    await new Promise((resolve) => client.once('connect', resolve))
    const closedByServer = new Promise((resolve) => client.once('close', resolve))
    await reservation.release()
    await closedByServer
    // The real listener takes the port.
    const server = net.createServer()
    await new Promise<void>((resolve) => server.listen({ port, host: '127.0.0.1', exclusive: true }, resolve))
    expect((server.address() as net.AddressInfo).port).toBe(port)
    await new Promise((resolve) => server.close(resolve))
    expect(server.listening).toBe(false)
  }, 15_000)
})
