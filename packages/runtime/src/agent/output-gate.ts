import type { AgentEvent } from './types.js'

/**
 * Back-pressure from a turn's reader to its agent: the reader closes the gate while it is behind
 * (the agent's output is not read: its writes block once the pipe or socket is full) and opens it
 * once it caught up.
 */
export class OutputGate {
  private closed = false
  private readonly watchers = new Set<(open: boolean) => void>()

  get open(): boolean {
    return !this.closed
  }

  set(open: boolean): void {
    if (open === !this.closed) return
    this.closed = !open
    for (const watcher of this.watchers) watcher(open)
  }

  /** Calls `watcher` on each change (at once when the gate is closed now); returns the unwatch. */
  watch(watcher: (open: boolean) => void): () => void {
    this.watchers.add(watcher)
    if (this.closed) watcher(false)
    return () => this.watchers.delete(watcher)
  }
}

/** About how many characters an event holds on the wire (what the reader's queue is measured in). */
export function eventChars(event: AgentEvent): number {
  switch (event.type) {
    case 'text':
      return 64 + event.content.length
    case 'status':
      return 64 + event.message.length
    default:
      return 64 + JSON.stringify(event).length
  }
}
