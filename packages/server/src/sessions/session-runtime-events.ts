import type { NetworkEvent, PauseEvent, RuntimeEvents } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { Clock } from '../clock.js'
import { recordPauseEvent } from '../pause/pause-policy.js'
import type { SessionStore } from './session-store.js'

/**
 * What the runtime reports of a session's sandboxes outside any call (the port's `RuntimeEvents`),
 * written to the session's records behind: a failed write is logged, never thrown at the runtime.
 */
export class SessionRuntimeEvents implements RuntimeEvents {
  constructor(
    private readonly store: Pick<SessionStore, 'networkLog' | 'statusOf' | 'note'>,
    private readonly clock: Clock,
    private readonly logger: Pick<Logger, 'warn'>,
  ) {}

  pause(sessionId: string, event: PauseEvent): void {
    void recordPauseEvent(this.store, this.clock, sessionId, event).catch((error: unknown) =>
      this.logger.warn({ err: error, session: sessionId }, 'recording a pause event failed'),
    )
  }

  network(sessionId: string, event: NetworkEvent): void {
    void this.store.networkLog
      .record(sessionId, event)
      .catch((error: unknown) =>
        this.logger.warn({ err: error, session: sessionId }, 'recording a network event failed'),
      )
  }
}
