import type net from 'node:net'
import { CairnProblem } from '@cairn/protocol'
import { FORWARDER_PORTS } from '../egress/transparent.js'
import { listeningPorts } from '../ports/listening-ports.js'
import { PortRelay } from '../ports/port-relay.js'
import { requireCapability } from '../sandbox/capabilities.js'
import type { SandboxDriver } from '../sandbox/driver.js'
import type { Logger } from '../util/logger.js'

/** What the ports of an agent need to know of its process. */
export interface PortsHost {
  readonly sandboxId: string
  readonly alive: boolean
  readonly stopped: boolean
  /** Whether an egress forwarder runs inside the sandbox (its ports are not the session's). */
  readonly proxied: boolean
  /** The warm sandbox's network namespace (`/proc/<pid>/ns/net`), if it has one. */
  networkNamespace(): Promise<string | undefined>
}

/** Services inside an agent's sandbox, reached through a relay in its network namespace. */
export class AgentPorts {
  private relay: Promise<PortRelay> | undefined

  constructor(
    private readonly driver: SandboxDriver,
    private readonly host: PortsHost,
    /** Where the relay's socket goes (in the run dir). */
    private readonly socketPath: string,
    private readonly logger: Logger,
  ) {}

  private async namespace(): Promise<string> {
    requireCapability(this.driver, 'ports', 'reach a port inside the sandbox')
    const namespace = this.host.alive ? await this.host.networkNamespace() : undefined
    if (!namespace) {
      throw new CairnProblem(
        'sandbox_not_running',
        'the session has no running sandbox; send a message to start it',
      )
    }
    return namespace
  }

  /** A socket to 127.0.0.1:`port` inside the sandbox, through a relay started on first use. */
  async connect(port: number): Promise<net.Socket> {
    // A preview of the forwarder would lend the caller the session's egress (and proxy secrets).
    if (this.host.proxied && FORWARDER_PORTS.has(port))
      throw new CairnProblem(
        'forbidden',
        `port ${port} is Cairn's egress forwarder inside the sandbox, not a service of the session`,
      )
    const namespace = await this.namespace()
    // Shared by concurrent first requests; restarted should the relay have died.
    this.relay ??= PortRelay.start(namespace, this.socketPath)
    // A relay that failed to start is started again below (a second failure is the caller's).
    let relay = await this.relay.catch((error: unknown) => {
      this.logger.warn(
        { err: error, sandboxId: this.host.sandboxId },
        'the port relay failed to start; retrying',
      )
      return undefined
    })
    if (!relay?.alive) {
      this.relay = PortRelay.start(namespace, this.socketPath)
      relay = await this.relay
    }
    if (this.host.stopped) relay.stop()
    return relay.connect(port)
  }

  /** TCP ports a service listens on inside the sandbox (empty without a running sandbox). */
  async listening(): Promise<number[]> {
    if (!this.driver.capabilities.ports || !this.host.alive) return []
    const namespace = await this.host.networkNamespace()
    const pid = namespace ? Number(namespace.split('/')[2]) : undefined
    const ports = pid ? await listeningPorts(pid) : []
    return this.host.proxied ? ports.filter((port) => !FORWARDER_PORTS.has(port)) : ports
  }

  /** Stops the relay, if one was started; a relay that never started is only logged. */
  stop(onError: (error: unknown) => void): void {
    const relay = this.relay
    this.relay = undefined
    relay?.then((r) => r.stop()).catch(onError)
  }
}
