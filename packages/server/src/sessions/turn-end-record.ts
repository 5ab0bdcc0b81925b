import {
  CairnProblem,
  type ErrorCode,
  isErrorCode,
  type SessionStatus,
  type StatusCause,
  type StreamEvent,
} from '@cairn/protocol'
import type { TurnOutcome } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import { unavailableReason, whenNotBusy } from '../db/busy.js'
import type { Db } from '../db/database.js'
import type { StorageBudget, StorageReservation } from '../limits/storage-budget.js'
import type { TurnDraw } from '../limits/turn-admission.js'
import { type SessionStore, TurnEndedElsewhere, type TurnSessionRow } from './session-store.js'
import type { TurnEventLog } from './turn-events.js'

/**
 * Where a turn's events go: each with its id (its place in the turn, the SSE `id:`), except one
 * that is not part of the turn's record (a `run.failed` saying the end could not be recorded yet).
 * A promise: the client is behind, and the turn reads nothing more of its agent until it settles.
 */
export type TurnEmit = (event: StreamEvent, id?: number) => Promise<void> | undefined

/** How long a turn's end waits for an unavailable database before the client is told. */
const RECORD_WAIT_MS = 15_000

/**
 * A turn's end of at most this many bytes (its held events, terminal event, reply and stderr) is
 * admitted with the turn, before it starts (with its prompt: `TurnAdmission`), and counted once
 * written: a warm turn's end takes no extra statement. A larger one is reserved in the tenant's
 * budget before it is written.
 */
export const END_UNRESERVED_BYTES = 64 * 1024

/** Characters of a turn's stderr its row keeps (the last ones). */
const STDERR_KEPT_CHARS = 16_384

/** A turn that has run, as its end is recorded. */
export interface TurnEnding {
  row: TurnSessionRow
  turnId: string
  seq: number
  outcome: TurnOutcome
  durationMs: number
  endedAt: string
  endedAs: SessionStatus
  cause: StatusCause
  /** The workspace generation the turn left (undefined: unchanged, or not advanced). */
  generation: number | undefined
  /** The policy's last turn: the session is completed with it. */
  lastTurn: boolean
  log: TurnEventLog
  /** What the turn was admitted with (its prompt and the unreserved end): told what its end keeps. */
  admitted?: { draw: TurnDraw; promptBytes: number } | undefined
}

/**
 * Records a turn's end and streams its terminal event: true when the turn's own end was recorded
 * and sent; false when the client was told something else instead (the session's owner changed,
 * the turn was ended elsewhere, or the database did not answer in time: then the record is
 * retried behind).
 */
export async function recordTurnEnd(
  deps: { db: Db; store: SessionStore; logger: Logger; budget?: StorageBudget | undefined },
  ending: TurnEnding,
  emitNumbered: TurnEmit,
): Promise<boolean> {
  await ending.log.settle()
  const { turn, reservation } = await reserveEnd(deps, ending)
  let recorded = false
  try {
    recorded = await recordReserved(deps, turn, emitNumbered, reservation)
    return recorded
  } finally {
    // Recorded: settled into the rows already. Else (the record is retried behind) it lapses.
    if (reservation && !recorded) await deps.budget?.release(reservation).catch(() => undefined)
  }
}

/**
 * Reserves what the turn's end writes in its tenant's budget (its events not written yet, its
 * terminal event, its reply and stderr). An end that does not fit is recorded without them: the
 * turn fails `quota_exceeded`, its reply and held events dropped, its terminal event alone stored.
 */
async function reserveEnd(
  deps: { budget?: StorageBudget | undefined },
  turn: TurnEnding,
): Promise<{ turn: TurnEnding; reservation?: StorageReservation }> {
  const { outcome, log, row } = turn
  const bytes =
    log.endBytes(terminalEvent(turn.turnId, outcome, turn.durationMs)) +
    Buffer.byteLength(outcome.text) +
    Buffer.byteLength(outcome.stderr.slice(-STDERR_KEPT_CHARS))
  // Up to the bound, the end was admitted with the turn; past it, it is reserved now.
  turn.admitted?.draw.end(turn.admitted.promptBytes + (bytes <= END_UNRESERVED_BYTES ? bytes : 0))
  if (!deps.budget || bytes <= END_UNRESERVED_BYTES) return { turn }
  try {
    return { turn, reservation: await deps.budget.reserve(row.tenant_id, bytes, "a turn's end") }
  } catch (error) {
    if (!(error instanceof CairnProblem && error.code === 'quota_exceeded')) throw error
    log.dropHeld()
    const refused: TurnOutcome = {
      status: 'failed',
      code: 'quota_exceeded',
      cause: 'quota_exceeded',
      message: `the turn's end did not fit: ${error.message}`,
      text: '',
      stderr: '',
    }
    return { turn: { ...turn, outcome: refused, endedAs: 'failed', cause: 'quota_exceeded' } }
  }
}

async function recordReserved(
  deps: { db: Db; store: SessionStore; logger: Logger; budget?: StorageBudget | undefined },
  turn: TurnEnding,
  emitNumbered: TurnEmit,
  reservation: StorageReservation | undefined,
): Promise<boolean> {
  const { row, turnId, seq, outcome, durationMs, endedAt, endedAs, cause, generation, lastTurn, log } = turn
  const maxTurns = row.max_turns
  const failed = outcome.status === 'failed' ? outcome : undefined
  // The turn's entry, the session's status and generation in one transaction, retried while
  // another process holds the database lock: the reply was streamed already, it must not be lost.
  // Nothing is awaited between the terminal event and the release of the turn lock, so a client
  // that sends its next message on `run.completed` never meets `session_busy`.
  // Only while the session's owner epoch is the one the turn began with: once its node was
  // declared lost (or the session moved) the leader has failed this turn, and a late end from
  // the old owner changes nothing.
  let ownerChanged = false
  const ended = terminalEvent(turnId, outcome, durationMs)
  const lost: StreamEvent = {
    type: 'run.failed',
    turnId,
    durationMs,
    error: {
      code: 'node_lost',
      message: `the session's node was declared lost (or the session moved) while turn ${turnId} ran; its end was not recorded`,
    },
  }
  // Ended meanwhile by someone else (its relay's lease lapsed: `replica_lost`): not overwritten.
  let endedElsewhere: StreamEvent | undefined
  // The turn's events not written yet go with its record, its terminal event last: a client
  // resuming the stream through any replica gets exactly what it streamed.
  const finish = () =>
    deps.db.transaction(async () => {
      // The reservation is settled into the rows this writes (the counters count them).
      if (reservation) await deps.budget?.release(reservation)
      ownerChanged = !(await deps.store.finishTurn(
        { id: row.id, status: row.status, ownerEpoch: row.owner_epoch },
        {
          id: turnId,
          status: outcome.status,
          response: outcome.text,
          stderr: outcome.stderr.slice(-STDERR_KEPT_CHARS),
          errorCode: failed?.code ?? null,
          errorMessage: failed?.message ?? null,
          endedAt,
          durationMs,
        },
        { to: endedAs, cause, detail: failed ? `${turnId}: ${failed.message}` : turnId, generation },
      ))
      if (ownerChanged) {
        await log.writeEnd(lost)
        return
      }
      if (lastTurn) {
        await deps.store.transition(
          { id: row.id, status: endedAs },
          'completed',
          'max_turns',
          endedAt,
          `${seq} of ${maxTurns} turns`,
        )
      }
      await log.writeEnd(ended)
    })
  const record = async () => {
    endedElsewhere = undefined
    try {
      await finish()
    } catch (error) {
      if (!(error instanceof TurnEndedElsewhere)) throw error
      // Nothing of the end above was committed: the stream gets the end someone else recorded.
      const elsewhere = elsewhereEnd(turnId, durationMs, error.code)
      ownerChanged = false
      endedElsewhere = elsewhere
      await deps.db.transaction(() => log.writeEnd(elsewhere))
    }
  }
  try {
    await whenNotBusy(record, RECORD_WAIT_MS)
  } catch (error) {
    // The database did not answer in time (PostgreSQL down, SQLite locked): the client is told
    // so, typed and retryable, instead of waiting on; the record is retried behind until the
    // database is back, which ends the session's running turn (the next message is refused
    // with session_busy until then). This event is not the turn's: it has no id, and a client
    // resuming the stream later gets the turn's own end once it is recorded.
    const reason = unavailableReason(error)
    deps.logger.error({ err: error, session: row.id, turn: turnId }, 'recording the end of a turn failed')
    emitNumbered({
      type: 'run.failed',
      turnId,
      durationMs,
      error: {
        code: reason ? 'unavailable' : 'internal',
        message: `the turn ended (${outcome.status}) but could not be recorded yet: ${reason ?? (error as Error).message}; it is recorded once the database answers, retry then`,
      },
    })
    void whenNotBusy(record, Number.POSITIVE_INFINITY, 1000).then(
      () => log.end(),
      (late: unknown) =>
        deps.logger.error({ err: late, session: row.id, turn: turnId }, 'a turn could not be recorded'),
    )
    return false
  }
  if (ownerChanged) {
    deps.logger.warn(
      { session: row.id, turn: turnId, ownerEpoch: row.owner_epoch },
      "a turn's end was not recorded: the session's owner changed during the turn",
    )
    emitNumbered(lost, log.end())
    return false
  }
  if (endedElsewhere) {
    deps.logger.warn(
      { session: row.id, turn: turnId, event: endedElsewhere },
      "a turn's end was not recorded: it was ended while it ran",
    )
    emitNumbered(endedElsewhere, log.end())
    return false
  }
  emitNumbered(ended, log.end())
  return true
}

/** The event that ends a turn's stream, from its outcome. */
function terminalEvent(turnId: string, outcome: TurnOutcome, durationMs: number): StreamEvent {
  if (outcome.status === 'completed') return { type: 'run.completed', turnId, text: outcome.text, durationMs }
  if (outcome.status === 'cancelled') return { type: 'run.cancelled', turnId, durationMs }
  return {
    type: 'run.failed',
    turnId,
    durationMs,
    error: {
      code: outcome.code,
      message: outcome.message,
      details: { stderrTail: outcome.stderr.slice(-2000) },
    },
  }
}

/**
 * What a relay tells its client of a turn someone else ended while it ran (`code`: the row's, a
 * lapsed lease's `replica_lost`).
 */
function elsewhereEnd(turnId: string, durationMs: number, code: string): StreamEvent {
  const known: ErrorCode = isErrorCode(code) ? code : 'replica_lost'
  return {
    type: 'run.failed',
    turnId,
    durationMs,
    error: {
      code: known,
      message: `turn ${turnId} was ended (${known}) while this replica relayed it (its lease lapsed); its end was not recorded`,
    },
  }
}
