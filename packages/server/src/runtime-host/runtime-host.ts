import type { RuntimeEvents, RuntimePort } from '@cairn/runtime/port'
import type { SessionRouting } from '../sessions/session-deps.js'

/**
 * What the server runs its sessions on, as the composition root sees it: the local runtime
 * (`--role all`) or the cluster's nodes reached by routing (`--role api`). Either way the
 * services get only the port.
 */
export interface RuntimeHost {
  port: RuntimePort
  /** The runtime ID sessions made here are recorded under (an API replica has its own, owning none). */
  runtimeId: string
  /** The sandbox driver and storage driver named in workspace manifests. */
  drivers: { isolation: string; storage: string }
  /** Kept free in the pool for Cairn's own writes (undefined: none set). */
  reserveBytes: number | undefined
  /** Set for an API replica: every session is routed to its node. */
  routing: SessionRouting | undefined
  /** For the start-up log line. */
  describe(): Record<string, unknown>
  close(): Promise<void>
}

/** Where runtime events go once the session service exists (the port is made before it). */
export class DeferredRuntimeEvents implements RuntimeEvents {
  target: RuntimeEvents | undefined
  pause: RuntimeEvents['pause'] = (id, event) => this.target?.pause(id, event)
  network: RuntimeEvents['network'] = (id, event) => this.target?.network(id, event)
}
