import { isErrorCode, isTerminalEvent, type StreamEvent } from '@cairn/protocol'
import type { Logger } from 'pino'
import type { HintFeed } from '../cluster/cluster-hints.js'
import type { Db } from '../db/database.js'

/** An event of a turn with its id: its place in the turn, from 1 (the SSE `id:`). */
export interface NumberedEvent {
  id: number
  event: StreamEvent
}

/** How long a running turn's events wait in memory before they are written (one batch). */
export const DEFAULT_TURN_EVENTS_FLUSH_MS = 250
/** Rows per INSERT (SQLite's bound on statement parameters). */
const ROWS_PER_INSERT = 300

export const TERMINAL_EVENT_TYPES = ['run.completed', 'run.failed', 'run.cancelled'] as const

export interface TurnEventsDeps {
  db: Db
  logger: Logger
  /** Told after each write, so replicas streaming the turn to a resumed client read at once. */
  hints?: HintFeed | undefined
  flushMs?: number | undefined
}

/**
 * The events of one turn while it runs on this process: numbered as they are streamed, kept in
 * memory (a client resuming through this replica is served from here), and written to the
 * database in batches, at most every `flushMs` and with the turn's end in the transaction that
 * records it, so a turn shorter than `flushMs` (a warm one) costs no extra write.
 */
export class TurnEventLog {
  private readonly events: NumberedEvent[] = []
  /** Events [0, written) are in the database. */
  private written = 0
  private timer: NodeJS.Timeout | undefined
  private flushing: Promise<void> | undefined
  private settled = false
  private ended = false
  private readonly followers = new Set<(event: NumberedEvent | undefined) => void>()

  constructor(
    readonly turnId: string,
    private readonly deps: TurnEventsDeps,
    private readonly onEnd: () => void,
  ) {}

  /** Numbers `event` and hands it to the followers; it is written with the next batch. */
  append(event: StreamEvent): number {
    const numbered = { id: this.events.length + 1, event }
    this.events.push(numbered)
    for (const follower of this.followers) follower(numbered)
    this.schedule()
    return numbered.id
  }

  /** The events after `after`, then each one as it comes; `undefined` once the turn's end was sent. */
  follow(after: number, listener: (event: NumberedEvent | undefined) => void): () => void {
    for (const numbered of this.events) if (numbered.id > after) listener(numbered)
    if (this.ended) {
      listener(undefined)
      return () => undefined
    }
    this.followers.add(listener)
    return () => this.followers.delete(listener)
  }

  /** Stops the batches: what is left is written by `writeEnd`, inside the turn's record. */
  async settle(): Promise<void> {
    this.settled = true
    if (this.timer) clearTimeout(this.timer)
    this.timer = undefined
    await this.flushing
  }

  /**
   * Writes the events not written yet and the turn's terminal event, in the caller's transaction
   * (idempotent: a retried transaction writes the same rows). Returns the terminal's id.
   */
  async writeEnd(terminal: StreamEvent): Promise<number> {
    const id = this.events.length + 1
    await this.insert([...this.events.slice(this.written), { id, event: terminal }])
    return id
  }

  /** The terminal event written by `writeEnd` was committed: it goes to the followers, the log ends. */
  end(terminal: StreamEvent): number {
    const numbered = { id: this.events.length + 1, event: terminal }
    this.events.push(numbered)
    this.written = this.events.length
    this.ended = true
    for (const follower of this.followers) {
      follower(numbered)
      follower(undefined)
    }
    this.followers.clear()
    this.onEnd()
    return numbered.id
  }

  private schedule(): void {
    if (this.settled || this.timer || this.flushing) return
    this.timer = setTimeout(() => this.flush(), this.deps.flushMs ?? DEFAULT_TURN_EVENTS_FLUSH_MS)
    this.timer.unref()
  }

  private flush(): void {
    this.timer = undefined
    const rows = this.events.slice(this.written)
    if (rows.length === 0) return
    this.flushing = this.deps.db
      .transaction(() => this.insert(rows))
      .then(
        () => {
          this.written = Math.max(this.written, rows.at(-1)?.id ?? 0)
        },
        (error: unknown) =>
          // Kept in memory: the next batch (or the turn's record) writes them.
          this.deps.logger.warn({ err: error, turn: this.turnId }, "writing a turn's events failed"),
      )
      .finally(() => {
        this.flushing = undefined
        if (this.written < this.events.length) this.schedule()
      })
  }

  private async insert(rows: NumberedEvent[]): Promise<void> {
    await insertEvents(this.deps.db, this.turnId, rows)
    const last = rows.at(-1)
    if (last && this.deps.hints)
      await this.deps.hints.publish({ kind: 'turn.events', turnId: this.turnId, id: last.id })
  }
}

/** A turn's row as a resumed stream reads it. */
export interface EndedTurn {
  id: string
  status: string
  response: string
  error_code: string | null
  error_message: string | null
  duration_ms: number | null
}

/** The terminal event of a turn that ended without one written, from its row. */
function endFromRow(turn: EndedTurn): StreamEvent {
  const durationMs = turn.duration_ms ?? 0
  if (turn.status === 'completed')
    return { type: 'run.completed', turnId: turn.id, text: turn.response, durationMs }
  if (turn.status === 'cancelled') return { type: 'run.cancelled', turnId: turn.id, durationMs }
  return {
    type: 'run.failed',
    turnId: turn.id,
    durationMs,
    error: {
      code: isErrorCode(turn.error_code) ? turn.error_code : 'internal',
      message: turn.error_message ?? `the turn ended ${turn.status}`,
    },
  }
}

/** Writes events of a turn; rows already there (a retried write) are left as they are. */
export async function insertEvents(db: Db, turnId: string, rows: NumberedEvent[]): Promise<void> {
  for (let i = 0; i < rows.length; i += ROWS_PER_INSERT) {
    await db.q
      .insertInto('turn_events')
      .values(
        rows.slice(i, i + ROWS_PER_INSERT).map(({ id, event }) => ({
          turn_id: turnId,
          seq: id,
          type: event.type,
          event: JSON.stringify(event),
        })),
      )
      .onConflict((oc) => oc.columns(['turn_id', 'seq']).doNothing())
      .execute()
  }
}

/**
 * The turns whose events this process is streaming, and the stored events of any turn (what every
 * replica reads to resume a stream).
 */
export class TurnEvents {
  private readonly live = new Map<string, TurnEventLog>()

  constructor(private readonly deps: TurnEventsDeps) {}

  get hints(): HintFeed | undefined {
    return this.deps.hints
  }

  /** A log for a turn that begins on this process. */
  open(turnId: string): TurnEventLog {
    const log = new TurnEventLog(turnId, this.deps, () => this.live.delete(turnId))
    this.live.set(turnId, log)
    return log
  }

  /** The log of a turn this process streams, until its end is recorded. */
  running(turnId: string): TurnEventLog | undefined {
    return this.live.get(turnId)
  }

  /** What a resumed stream needs of a turn's row: its state and, once ended, its outcome. */
  async turn(sessionId: string, turnId: string): Promise<EndedTurn | undefined> {
    const row = await this.deps.db.q
      .selectFrom('turns')
      .select(['id', 'status', 'response', 'error_code', 'error_message', 'duration_ms'])
      .where('id', '=', turnId)
      .where('session_id', '=', sessionId)
      .executeTakeFirst()
    return row && { ...row, duration_ms: row.duration_ms === null ? null : Number(row.duration_ms) }
  }

  /** The turn's row as it is now (its replica may have ended it meanwhile). */
  async current(turnId: string): Promise<EndedTurn | undefined> {
    const row = await this.deps.db.q
      .selectFrom('turns')
      .select(['id', 'status', 'response', 'error_code', 'error_message', 'duration_ms'])
      .where('id', '=', turnId)
      .executeTakeFirst()
    return row && { ...row, duration_ms: row.duration_ms === null ? null : Number(row.duration_ms) }
  }

  /**
   * The id of the turn's terminal event. A turn ended without one written (its replica or node
   * died, or it predates stored events) is given one from its row, after `after` and every stored
   * event, and it is stored: whoever asks next is told the same end at the same id.
   */
  async endOf(turn: EndedTurn, after: number): Promise<number> {
    const { terminal, last } = await this.bounds(turn.id)
    if (terminal !== undefined) return terminal
    const id = Math.max(last, after) + 1
    await insertEvents(this.deps.db, turn.id, [{ id, event: endFromRow(turn) }])
    return (await this.bounds(turn.id)).terminal ?? id
  }

  /** Stored events after `after`, up to the first terminal one, oldest first. */
  async stored(turnId: string, after: number): Promise<NumberedEvent[]> {
    const rows = await this.deps.db.q
      .selectFrom('turn_events')
      .select(['seq', 'event'])
      .where('turn_id', '=', turnId)
      .where('seq', '>', after)
      .orderBy('seq')
      .execute()
    const out: NumberedEvent[] = []
    for (const row of rows) {
      const event = JSON.parse(row.event) as StreamEvent
      out.push({ id: Number(row.seq), event })
      if (isTerminalEvent(event)) break
    }
    return out
  }

  /** The id of the turn's first stored terminal event, and the highest id stored. */
  async bounds(turnId: string): Promise<{ terminal: number | undefined; last: number }> {
    const row = await this.deps.db.q
      .selectFrom('turn_events')
      .select((eb) => [
        eb.fn.max('seq').as('last'),
        eb.fn
          .min(
            eb
              .case()
              .when('type', 'in', [...TERMINAL_EVENT_TYPES])
              .then(eb.ref('seq'))
              .end(),
          )
          .as('terminal'),
      ])
      .where('turn_id', '=', turnId)
      .executeTakeFirst()
    const terminal = row?.terminal
    return {
      terminal: terminal === null || terminal === undefined ? undefined : Number(terminal),
      last: Number(row?.last ?? 0),
    }
  }
}
