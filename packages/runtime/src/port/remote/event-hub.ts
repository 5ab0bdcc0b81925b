import type { NetworkEvent } from '../../egress/proxy.js'
import type { PauseEvent, RuntimeEvents } from '../runtime-port.js'

/** A runtime event as it crosses to an API replica. */
export type RuntimeEventFrame =
  | { kind: 'pause'; sessionId: string; event: PauseEvent }
  | { kind: 'network'; sessionId: string; event: NetworkEvent }

/** Events kept while no API replica listens (the oldest go first beyond this). */
const BACKLOG_LIMIT = 10_000

/**
 * A node's `RuntimeEvents`: given to its `LocalRuntimePort`, served by `serveRuntimePort` to the
 * API replicas that subscribe. Each event goes to one of them (the latest to subscribe; they
 * share one database, so one write is enough), or waits in a bounded backlog until one does.
 */
export class RuntimeEventHub implements RuntimeEvents {
  private readonly listeners: ((frame: RuntimeEventFrame) => void)[] = []
  private readonly backlog: RuntimeEventFrame[] = []

  pause(sessionId: string, event: PauseEvent): void {
    this.emit({ kind: 'pause', sessionId, event })
  }

  network(sessionId: string, event: NetworkEvent): void {
    this.emit({ kind: 'network', sessionId, event })
  }

  /** Sends every event (the backlog first) to `listener` until the answer is called. */
  subscribe(listener: (frame: RuntimeEventFrame) => void): () => void {
    for (const frame of this.backlog.splice(0)) listener(frame)
    this.listeners.push(listener)
    return () => {
      const at = this.listeners.indexOf(listener)
      if (at >= 0) this.listeners.splice(at, 1)
    }
  }

  private emit(frame: RuntimeEventFrame): void {
    const listener = this.listeners[this.listeners.length - 1]
    if (listener) {
      listener(frame)
      return
    }
    this.backlog.push(frame)
    if (this.backlog.length > BACKLOG_LIMIT) this.backlog.shift()
  }
}
