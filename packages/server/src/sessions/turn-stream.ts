import { isTerminalEvent } from '@cairn/protocol'
import type { Logger } from 'pino'
import type { EndedTurn, NumberedEvent, TurnEventLog, TurnEvents } from './turn-events.js'
import { STORED_PAGE_ROWS } from './turn-events.js'

/** How often a resumed stream of a turn running elsewhere reads its new events (hints come sooner). */
export const DEFAULT_TURN_EVENTS_POLL_MS = 500

/**
 * Sends one event of a resumed stream; a promise when the client is behind (the next event waits
 * for it, so a stream holds a page of events at most).
 */
export type ReplaySend = (event: NumberedEvent) => Promise<void> | undefined

/** A turn's stream picked up after an event: `stream` sends what follows and resolves at its end. */
export interface TurnReplay {
  stream(send: ReplaySend, signal: AbortSignal): Promise<void>
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
    if (log) return { stream: (send, signal) => followLocal(log, events, after, send, signal) }
    if (turn.status === 'running') return { stream: (send, signal) => this.tail(turn, after, send, signal) }
    const end = await events.endOf(turn, after)
    if (after >= end) return undefined
    return {
      stream: async (send, signal) => {
        let last = after
        for (;;) {
          const rows = await events.stored(turn.id, last)
          const sent = await sendAll(rows, send, signal)
          if (sent.over || rows.length < STORED_PAGE_ROWS) return
          last = sent.last ?? last
        }
      },
    }
  }

  /** Follows a turn running on another replica (or being recorded) through the database. */
  private async tail(turn: EndedTurn, after: number, send: ReplaySend, signal: AbortSignal): Promise<void> {
    const { events } = this.deps
    let last = after
    while (!signal.aborted) {
      try {
        // The row first: its end and the terminal event are written in one transaction, so rows
        // read after a row that says "ended" hold the terminal event if there is one.
        const latest = (await events.current(turn.id)) ?? turn
        const ended = latest.status !== 'running'
        if (ended) await events.endOf(latest, last)
        const rows = await events.stored(turn.id, last)
        const sent = await sendAll(rows, send, signal)
        last = sent.last ?? last
        if (sent.over) return
        // A full page: more are stored already.
        if (rows.length === STORED_PAGE_ROWS) continue
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

/**
 * Sends `rows` in order, each after the client took the one before; `over`: the terminal event was
 * sent or the client went; `last`: the id of the last one sent.
 */
async function sendAll(
  rows: NumberedEvent[],
  send: ReplaySend,
  signal: AbortSignal,
): Promise<{ over: boolean; last: number | undefined }> {
  let last: number | undefined
  for (const row of rows) {
    if (signal.aborted) return { over: true, last }
    const behind = send(row)
    last = row.id
    if (isTerminalEvent(row.event)) return { over: true, last }
    if (behind) await behind
  }
  return { over: signal.aborted, last }
}

/**
 * Follows a turn this process runs: the events after `after` that are written from the database
 * (a page at a time), the others from the log's memory, then each as it comes, until its end.
 */
async function followLocal(
  log: TurnEventLog,
  events: TurnEvents,
  after: number,
  send: ReplaySend,
  signal: AbortSignal,
): Promise<void> {
  let last = after
  while (!signal.aborted) {
    const held = log.over ? undefined : log.since(last)
    const rows = held ?? (await events.stored(log.turnId, last))
    const sent = await sendAll(rows, send, signal)
    last = sent.last ?? last
    if (sent.over) return
    if (rows.length > 0) continue
    // Nothing after `last`: an ended log has every event in the database, the terminal one too.
    if (log.over && held === undefined) return
    await log.next(signal)
  }
}
