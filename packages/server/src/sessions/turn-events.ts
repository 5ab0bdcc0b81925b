import { CairnProblem, isErrorCode, isTerminalEvent, type StreamEvent } from '@cairn/protocol'
import type { QueryCreator, RawBuilder } from 'kysely'
import type { Logger } from 'pino'
import type { HintFeed } from '../cluster/cluster-hints.js'
import type { Db } from '../db/database.js'
import type { Schema } from '../db/schema.js'
import type { StorageBudget } from '../limits/storage-budget.js'

/** An event of a turn with its id: its place in the turn, from 1 (the SSE `id:`). */
export interface NumberedEvent {
  id: number
  event: StreamEvent
}

/** How long a running turn's events wait in memory before they are written (one batch). */
export const DEFAULT_TURN_EVENTS_FLUSH_MS = 250
/**
 * Characters (as JSON) of a running turn's events not yet written above which they are written
 * at once and the turn reads nothing more of its agent until they are: a turn's memory is bounded
 * by this, whatever its length. Small beside V8's young generation (16 MiB semi-spaces), so that
 * an agent flooding at the database's pace has each batch written and dropped before garbage
 * collection promotes it: at 1 MiB the events reached the old space, whose garbage V8 let grow
 * by 100–150 MiB between full collections.
 */
export const TURN_EVENTS_HIGH_CHARS = 256 * 1024
/** Rows per INSERT (SQLite's bound on statement parameters). */
const ROWS_PER_INSERT = 300

/** Stored events read at once by a resumed stream (its memory is bounded by a page, not by the turn). */
export const STORED_PAGE_ROWS = 500

export const TERMINAL_EVENT_TYPES = ['run.completed', 'run.failed', 'run.cancelled'] as const

export interface TurnEventsDeps {
  db: Db
  logger: Logger
  /** Told after each write, so replicas streaming the turn to a resumed client read at once. */
  hints?: HintFeed | undefined
  flushMs?: number | undefined
  /** The tenant storage budget each batch written while the turn runs is reserved in first. */
  budget?: StorageBudget | undefined
}

/** Who the turn's events are kept for, and what to do when its budget refuses them. */
export interface TurnEventOwner {
  tenantId: string
  /** Told once, when a batch did not fit: the turn is to stop (its held events go with its end). */
  refused: (problem: CairnProblem) => void
}

/** An event with its JSON (measured once, written as it is). */
interface HeldEvent extends NumberedEvent {
  json: string
}

/**
 * The events of one turn while it runs on this process: numbered as they are streamed, kept in
 * memory until written (a client resuming through this replica reads the written ones from the
 * database, the rest from here), and written to the database in batches, at most every `flushMs`
 * (at once past `TURN_EVENTS_HIGH_CHARS`) and with the turn's end in the transaction that records
 * it, so a turn shorter than `flushMs` (a warm one) costs no extra write.
 *
 * Each batch written while the turn runs is reserved in the tenant's storage budget first (the
 * reservation settled into the rows in one transaction); one that does not fit is not written,
 * no batch is tried after it, and the owner is told, which stops the turn. What the turn's end
 * writes with it is reserved by `recordTurnEnd` (turn-end-record.ts) before it is written.
 */
export class TurnEventLog {
  /** The events not written yet: ids (written, last]. */
  private events: HeldEvent[] = []
  private heldChars = 0
  private last = 0
  /** Events up to this id are in the database. */
  private written = 0
  private timer: NodeJS.Timeout | undefined
  private flushing: Promise<void> | undefined
  private settled = false
  private ended = false
  private refusal: CairnProblem | undefined
  /** Told of the next event or of the end (each once). */
  private waiters: (() => void)[] = []

  constructor(
    readonly turnId: string,
    private readonly deps: TurnEventsDeps,
    private readonly onEnd: () => void,
    private readonly owner?: TurnEventOwner | undefined,
  ) {}

  /** Numbers `event` and wakes the readers; it is written with the next batch. */
  append(event: StreamEvent): number {
    const held = { id: ++this.last, event, json: JSON.stringify(event) }
    this.events.push(held)
    this.heldChars += held.json.length
    this.wake()
    if (this.heldChars > TURN_EVENTS_HIGH_CHARS) this.flushNow()
    else this.schedule()
    return held.id
  }

  /**
   * A promise while the events not written are over `TURN_EVENTS_HIGH_CHARS`: until they are
   * written (a write that failed is tried again every `flushMs`).
   */
  room(): Promise<void> | undefined {
    if (!this.full()) return undefined
    return (async () => {
      while (this.full()) {
        this.flushNow()
        await this.flushing
        if (this.full())
          await new Promise((resolve) =>
            setTimeout(resolve, this.deps.flushMs ?? DEFAULT_TURN_EVENTS_FLUSH_MS),
          )
      }
    })()
  }

  private full(): boolean {
    return this.heldChars > TURN_EVENTS_HIGH_CHARS && !this.settled && !this.refusal
  }

  /** Whether the terminal event was sent (all events are in the database then). */
  get over(): boolean {
    return this.ended
  }

  /**
   * The events after `after` while this log still holds them (`after` at or past what is
   * written), else undefined: they are in the database.
   */
  since(after: number): NumberedEvent[] | undefined {
    if (after < this.written) return undefined
    return this.events.filter((held) => held.id > after).map(({ id, event }) => ({ id, event }))
  }

  /** Resolves at the next event, the end, or `signal`'s abort. */
  next(signal: AbortSignal): Promise<void> {
    if (this.ended || signal.aborted) return Promise.resolve()
    return new Promise<void>((resolve) => {
      const done = () => {
        signal.removeEventListener('abort', done)
        resolve()
      }
      signal.addEventListener('abort', done, { once: true })
      this.waiters.push(done)
    })
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
   * (idempotent: a retried write writes the same rows). Returns the terminal's id.
   */
  async writeEnd(terminal: StreamEvent): Promise<number> {
    const id = this.last + 1
    await this.insert([...this.events, { id, event: terminal, json: JSON.stringify(terminal) }])
    return id
  }

  /** Bytes (UTF-8 JSON) `writeEnd(terminal)` writes: the events not written yet and `terminal`. */
  endBytes(terminal: StreamEvent): number {
    const held = this.events.reduce((sum, event) => sum + Buffer.byteLength(event.json), 0)
    return held + Buffer.byteLength(JSON.stringify(terminal))
  }

  /**
   * Forgets the events not written yet: a turn's end that did not fit in its tenant's budget keeps
   * its terminal event only (the ids of the dropped ones are not stored; a resumed stream skips them).
   */
  dropHeld(): void {
    this.events = []
    this.heldChars = 0
  }

  /** The terminal event written by `writeEnd` was committed: the readers are woken, the log ends. */
  end(): number {
    const id = ++this.last
    this.events = []
    this.heldChars = 0
    this.written = id
    this.ended = true
    this.wake()
    this.onEnd()
    return id
  }

  private wake(): void {
    for (const waiter of this.waiters.splice(0)) waiter()
  }

  private schedule(): void {
    if (this.settled || this.refusal || this.timer || this.flushing) return
    this.timer = setTimeout(() => this.flush(), this.deps.flushMs ?? DEFAULT_TURN_EVENTS_FLUSH_MS)
    this.timer.unref()
  }

  private flushNow(): void {
    if (this.settled || this.refusal || this.flushing) return
    if (this.timer) clearTimeout(this.timer)
    this.flush()
  }

  private flush(): void {
    this.timer = undefined
    const rows = this.events.slice()
    if (rows.length === 0) return
    const upTo = rows.at(-1)?.id ?? 0
    this.flushing = this.write(rows)
      .then(
        () => {
          if (upTo <= this.written) return
          this.written = upTo
          // Written: dropped from memory (a reader behind reads them from the database).
          const kept = this.events.filter((held) => held.id > upTo)
          this.heldChars = kept.reduce((sum, held) => sum + held.json.length, 0)
          this.events = kept
        },
        (error: unknown) => {
          // Kept in memory: the next batch (or the turn's record) writes them.
          if (error instanceof CairnProblem && error.code === 'quota_exceeded') return this.refuse(error)
          this.deps.logger.warn({ err: error, turn: this.turnId }, "writing a turn's events failed")
        },
      )
      .finally(() => {
        this.flushing = undefined
        if (this.events.length > 0) this.schedule()
      })
  }

  /** A batch written while the turn runs: reserved in the tenant's budget, then settled into its rows. */
  private async write(rows: HeldEvent[]): Promise<void> {
    const { budget, db } = this.deps
    if (!budget || !this.owner) return db.transaction(() => this.insert(rows))
    const bytes = rows.reduce((sum, held) => sum + Buffer.byteLength(held.json), 0)
    const reservation = await budget.reserve(this.owner.tenantId, bytes, "a turn's events")
    try {
      await budget.settle(reservation, () => this.insert(rows))
    } catch (error) {
      await budget.release(reservation).catch(() => undefined)
      throw error
    }
  }

  private refuse(problem: CairnProblem): void {
    if (this.refusal) return
    this.refusal = problem
    this.deps.logger.info(
      { turn: this.turnId, err: problem },
      "a turn's events did not fit its tenant's budget",
    )
    this.owner?.refused(problem)
  }

  /** Writes `rows`; the hint that they were goes with the write of the last of them. */
  private async insert(rows: HeldEvent[]): Promise<void> {
    const last = rows.at(-1)
    const hint =
      last && this.deps.hints?.notification({ kind: 'turn.events', turnId: this.turnId, id: last.id })
    await insertEvents(this.deps.db, this.turnId, rows, hint)
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

/**
 * Writes events of a turn; rows already there (a retried write) are left as they are.
 * `notification` (a hint, PostgreSQL) is sent by the statement that writes the last rows.
 */
export async function insertEvents(
  db: Db,
  turnId: string,
  rows: (NumberedEvent & { json?: string })[],
  notification?: RawBuilder<unknown>,
): Promise<void> {
  if (!notification && rows.length <= SHAPED_ROWS) return insertShaped(db, turnId, rows)
  for (let i = 0; i < rows.length; i += ROWS_PER_INSERT) {
    const insert = (qc: QueryCreator<Schema>) =>
      qc
        .insertInto('turn_events')
        .values(
          rows.slice(i, i + ROWS_PER_INSERT).map(({ id, event, json }) => ({
            turn_id: turnId,
            seq: id,
            type: event.type,
            event: json ?? JSON.stringify(event),
          })),
        )
        .onConflict((oc) => oc.columns(['turn_id', 'seq']).doNothing())
    if (notification && i + ROWS_PER_INSERT >= rows.length)
      await db.q.with('written', insert).selectNoFrom(notification.as('notified')).execute()
    else await insert(db.q).execute()
  }
}

/** A batch of at most this many events (a warm turn's) is inserted by a statement compiled once. */
const SHAPED_ROWS = 8

/** `insertEvents` of a few rows without a notification: one statement, compiled once per count. */
async function insertShaped(
  db: Db,
  turnId: string,
  rows: (NumberedEvent & { json?: string })[],
): Promise<void> {
  const args: Record<string, string | number> = { turnId }
  for (const [i, { id, event, json }] of rows.entries()) {
    args[`seq${i}`] = id
    args[`type${i}`] = event.type
    args[`event${i}`] = json ?? JSON.stringify(event)
  }
  await db.shaped(`turn events x${rows.length}`, args, (q, a) =>
    q
      .insertInto('turn_events')
      .values(
        rows.map((_, i) => ({
          turn_id: a.turnId as string,
          seq: a[`seq${i}`] as number,
          type: a[`type${i}`] as string,
          event: a[`event${i}`] as string,
        })),
      )
      .onConflict((oc) => oc.columns(['turn_id', 'seq']).doNothing()),
  )
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

  /** A log for a turn that begins on this process (its events kept for `owner`'s tenant). */
  open(turnId: string, owner?: TurnEventOwner): TurnEventLog {
    const log = new TurnEventLog(turnId, this.deps, () => this.live.delete(turnId), owner)
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

  /** Stored events after `after`, up to the first terminal one, oldest first; at most `limit` rows read. */
  async stored(turnId: string, after: number, limit = STORED_PAGE_ROWS): Promise<NumberedEvent[]> {
    const rows = await this.deps.db.q
      .selectFrom('turn_events')
      .select(['seq', 'event'])
      .where('turn_id', '=', turnId)
      .where('seq', '>', after)
      .orderBy('seq')
      .limit(limit)
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
