import { isTerminalEvent } from '@cairn/protocol'
import type { Logger } from 'pino'
import type { EndedTurn, NumberedEvent, TurnEvents } from './turn-events.js'

/** How often a resumed stream of a turn running elsewhere reads its new events (hints come sooner). */
export const DEFAULT_TURN_EVENTS_POLL_MS = 500

/** A turn's stream picked up after an event: `stream` sends what follows and resolves at its end. */
export interface TurnReplay {
  stream(send: (event: NumberedEvent) => void, signal: AbortSignal): Promise<void>
}

/**
 * Streams of turns picked up again (`GET …/turns/{turnId}/events`), through any replica: a turn
 * this process runs is followed in its memory; any other is read from the database, where its
 * replica writes its events in batches, read again on each hint that it did (or every `pollMs`)
 * until its terminal event or its row says it ended.
 */
export class TurnStreams {
  private readonly wakers = new Map<string, Set<() => void>>()
  private listening: Promise<void> | undefined

  constructor(private readonly deps: { events: TurnEvents; logger: Logger; pollMs?: number | undefined }) {}

  /**
   * The turn's stream after event `after`; undefined when the turn ended and the client has its
   * terminal event already (answered 204: an EventSource stops reconnecting).
   */
  async replay(turn: EndedTurn, after: number): Promise<TurnReplay | undefined> {
    const { events } = this.deps
    const log = events.running(turn.id)
    if (log) return { stream: (send, signal) => followLocal(log, after, send, signal) }
    if (turn.status === 'running') return { stream: (send, signal) => this.tail(turn, after, send, signal) }
    const end = await events.endOf(turn, after)
    if (after >= end) return undefined
    const rows = await events.stored(turn.id, after)
    return {
      stream: async (send) => {
        for (const row of rows) send(row)
      },
    }
  }

  /** Follows a turn running on another replica (or being recorded) through the database. */
  private async tail(
    turn: EndedTurn,
    after: number,
    send: (event: NumberedEvent) => void,
    signal: AbortSignal,
  ): Promise<void> {
    const { events } = this.deps
    let last = after
    while (!signal.aborted) {
      try {
        // The row first: its end and the terminal event are written in one transaction, so rows
        // read after a row that says "ended" hold the terminal event if there is one.
        const latest = (await events.current(turn.id)) ?? turn
        const ended = latest.status !== 'running'
        if (ended) await events.endOf(latest, last)
        for (const row of await events.stored(turn.id, last)) {
          if (signal.aborted) return
          send(row)
          last = row.id
          if (isTerminalEvent(row.event)) return
        }
        if (ended) return
      } catch (error) {
        this.deps.logger.warn({ err: error, turn: turn.id }, "reading a turn's events failed; retrying")
      }
      await this.wait(turn.id, signal)
    }
  }

  /** Until a hint says the turn's events were written, `pollMs` passes, or the client goes. */
  private wait(turnId: string, signal: AbortSignal): Promise<void> {
    this.listen()
    return new Promise<void>((resolve) => {
      const set = this.wakers.get(turnId) ?? new Set<() => void>()
      this.wakers.set(turnId, set)
      const done = () => {
        clearTimeout(timer)
        signal.removeEventListener('abort', done)
        set.delete(done)
        if (set.size === 0 && this.wakers.get(turnId) === set) this.wakers.delete(turnId)
        resolve()
      }
      const timer = setTimeout(done, this.deps.pollMs ?? DEFAULT_TURN_EVENTS_POLL_MS)
      signal.addEventListener('abort', done, { once: true })
      set.add(done)
    })
  }

  private listen(): void {
    const hints = this.deps.events.hints
    if (!hints || this.listening) return
    const wake = (turnId: string) => {
      for (const waker of [...(this.wakers.get(turnId) ?? [])]) waker()
    }
    this.listening = hints
      .subscribe((hint) => {
        if (hint.kind === 'turn.events') wake(hint.turnId)
        else if (hint.kind === 'node.lost') for (const t of hint.turns) wake(t.turnId)
      })
      .then(
        () => undefined,
        (error: unknown) => {
          this.listening = undefined
          this.deps.logger.warn({ err: error }, 'could not listen for turn event hints; polling')
        },
      )
  }
}

/** Follows a turn this process runs: its events after `after` from memory, then as they come. */
function followLocal(
  log: { follow(after: number, listener: (event: NumberedEvent | undefined) => void): () => void },
  after: number,
  send: (event: NumberedEvent) => void,
  signal: AbortSignal,
): Promise<void> {
  return new Promise<void>((resolve) => {
    let finished = false
    let unfollow: (() => void) | undefined
    const finish = () => {
      if (finished) return
      finished = true
      unfollow?.()
      signal.removeEventListener('abort', finish)
      resolve()
    }
    signal.addEventListener('abort', finish, { once: true })
    unfollow = log.follow(after, (event) => {
      if (finished) return
      if (event === undefined) finish()
      else if (event.id > after) send(event)
    })
    if (finished || signal.aborted) finish()
  })
}
