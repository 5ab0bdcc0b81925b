import { type ChildProcess, spawn } from 'node:child_process'
import net from 'node:net'
import { fileURLToPath } from 'node:url'
import { CairnProblem } from '@cairn/protocol'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'

const HELPER = fileURLToPath(new URL('../../helpers/port_relay.py', import.meta.url))
/** The relay drops to this uid once inside the sandbox's network namespace (`nobody`). */
const RELAY_UID = 65534
const READY_TIMEOUT_MS = 5000
const CONNECT_TIMEOUT_MS = 10_000

/**
 * A host-side way into one sandbox's loopback: a helper process that entered the sandbox's network
 * namespace (see helpers/port_relay.py) and answers on a unix socket on the host.
 */
export class PortRelay {
  private constructor(
    private readonly child: ChildProcess,
    private readonly socketPath: string,
  ) {}

  static async start(netnsPath: string, socketPath: string): Promise<PortRelay> {
    // -I -S: no site packages or user environment to read; a third of Python's start-up here.
    const child = spawn('python3', ['-I', '-S', HELPER, netnsPath, socketPath, String(RELAY_UID)], {
      stdio: ['ignore', 'pipe', 'pipe'],
      ...OWN_PROCESS_GROUP,
    })
    let stderr = ''
    child.stderr?.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString()).slice(-2000)
    })
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => fail('the port relay did not start in time'), READY_TIMEOUT_MS)
      const fail = (message: string) => {
        clearTimeout(timer)
        child.kill('SIGKILL')
        reject(new CairnProblem('sandbox_failed', `${message}: ${stderr.trim()}`))
      }
      child.stdout?.once('data', () => {
        clearTimeout(timer)
        resolve()
      })
      child.once('exit', () => fail('the port relay exited'))
      child.once('error', (error) => fail(error.message))
    })
    child.removeAllListeners('exit')
    return new PortRelay(child, socketPath)
  }

  get alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null
  }

  /**
   * A socket connected to 127.0.0.1:`port` inside the sandbox; refused with `port_unreachable`
   * when nothing listens there.
   */
  connect(port: number): Promise<net.Socket> {
    return new Promise((resolve, reject) => {
      const socket = net.connect(this.socketPath)
      let head = Buffer.alloc(0)
      const timer = setTimeout(() => done(new Error('timed out')), CONNECT_TIMEOUT_MS)
      const done = (error?: Error, rest?: Buffer) => {
        clearTimeout(timer)
        socket.off('data', onData)
        socket.off('error', onError)
        socket.off('close', onClose)
        if (error) {
          socket.destroy()
          reject(
            error instanceof CairnProblem
              ? error
              : new CairnProblem('port_unreachable', `port ${port} in the sandbox: ${error.message}`, {
                  port,
                }),
          )
          return
        }
        socket.pause()
        if (rest && rest.length > 0) socket.unshift(rest)
        resolve(socket)
      }
      const onData = (chunk: Buffer) => {
        head = Buffer.concat([head, chunk])
        const end = head.indexOf(10)
        if (end < 0) {
          if (head.length > 128) done(new Error('bad answer from the port relay'))
          return
        }
        const line = head.subarray(0, end).toString()
        if (line === 'OK') return done(undefined, head.subarray(end + 1))
        const reason = line.replace(/^ERR /, '')
        done(
          new CairnProblem(
            'port_unreachable',
            reason === 'refused'
              ? `nothing listens on port ${port} in the sandbox`
              : `port ${port} in the sandbox cannot be reached (${reason})`,
            { port, reason },
          ),
        )
      }
      const onError = (error: Error) => done(error)
      const onClose = () => done(new Error('the port relay closed the connection'))
      socket.on('data', onData)
      socket.once('error', onError)
      socket.once('close', onClose)
      socket.once('connect', () => socket.write(`CONNECT ${port}\n`))
    })
  }

  stop(): void {
    this.child.kill('SIGKILL')
  }
}
