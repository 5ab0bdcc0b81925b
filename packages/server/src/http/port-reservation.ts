import net from 'node:net'
import { CairnProblem } from '@cairn/protocol'

/** A listening port held from the start of a server until its real listener takes it. */
export interface PortReservation {
  /** Lets the port go, for the real listener to bind it a moment later. */
  release(): Promise<void>
}

/**
 * Binds `port` on `host` at once, before the data dir, the database or the pool are touched, so
 * a port already taken fails the start in milliseconds with nothing mounted or reaped (it used to
 * fail only after the pool was mounted and checked, ~22 s). `port` 0 (any) cannot be taken: no
 * reservation. `option` names the flag that chooses another port.
 * A connection made to the port meanwhile (an API replica reaching a restarting node's address)
 * is closed at once: the release waits for none (it waited forever for one left open, so a node
 * restarted while replicas called it never served: found by the cluster model test).
 */
export async function reservePort(port: number, host: string, option: string): Promise<PortReservation> {
  if (port === 0) return { release: async () => undefined }
  const server = net.createServer((socket) => socket.destroy())
  await new Promise<void>((resolve, reject) => {
    server.once('error', (error: NodeJS.ErrnoException) => {
      if (error.code === 'EADDRINUSE')
        reject(
          new CairnProblem(
            'conflict',
            `port ${port} on ${host} is in use (by another Cairn server or another program); stop it, or choose another port with ${option}`,
            { port, host },
          ),
        )
      else reject(error)
    })
    server.listen({ port, host, exclusive: true }, () => resolve())
  })
  server.unref()
  return {
    release: () => new Promise<void>((resolve) => server.close(() => resolve())),
  }
}

/** Holds every port of `ports` (in order), or none: one taken lets go of the others and throws. */
export async function reservePorts(
  ports: { port: number; host: string; option: string }[],
): Promise<PortReservation> {
  const held: PortReservation[] = []
  const releaseAll = async () => {
    await Promise.all(held.splice(0).map((reservation) => reservation.release()))
  }
  try {
    for (const { port, host, option } of ports) held.push(await reservePort(port, host, option))
  } catch (error) {
    await releaseAll()
    throw error
  }
  return { release: releaseAll }
}
