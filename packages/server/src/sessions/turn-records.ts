import { type Message, newId, type StatusEvent, type TurnInfo } from '@cairn/protocol'
import { sql } from 'kysely'
import type { Db } from '../db/database.js'
import type { TurnRow } from './session-rows.js'

/**
 * A session's turns and status events as recorded: what the transcript routes read, and the copy of
 * a parent's turns a fork starts with.
 */
export class TurnRecords {
  constructor(private readonly db: Db) {}

  async turnRows(sessionId: string): Promise<TurnRow[]> {
    return (await this.db.q
      .selectFrom('turns')
      .selectAll()
      .where('session_id', '=', sessionId)
      .orderBy('seq')
      .execute()) as TurnRow[]
  }

  /** The conversation before turn `beforeSeq` (what a fresh sandbox's agent is given), oldest first. */
  async transcript(
    sessionId: string,
    beforeSeq: number,
  ): Promise<{ seq: number; prompt: string; response: string }[]> {
    return this.db.q
      .selectFrom('turns')
      .select(['seq', 'prompt', 'response'])
      .where('session_id', '=', sessionId)
      .where('seq', '<', beforeSeq)
      .orderBy('seq')
      .execute()
  }

  async turns(sessionId: string): Promise<TurnInfo[]> {
    return (await this.turnRows(sessionId)).map(toTurnInfo)
  }

  /** One turn by its ID alone, with its session and its error (a failed turn's); undefined: none. */
  async turnById(turnId: string): Promise<StoredTurn | undefined> {
    const row = (await this.db.q
      .selectFrom('turns')
      .selectAll()
      .where('id', '=', turnId)
      .executeTakeFirst()) as TurnRow | undefined
    if (!row) return undefined
    const error = row.error_code === null ? null : { code: row.error_code, message: row.error_message ?? '' }
    return { ...toTurnInfo(row), sessionId: row.session_id, error }
  }

  async messages(sessionId: string): Promise<Message[]> {
    const out: Message[] = []
    for (const t of await this.turnRows(sessionId)) {
      out.push({ role: 'user', content: t.prompt, turnId: t.id, turn: t.seq, createdAt: t.started_at })
      if (t.response || t.status !== 'running') {
        out.push({
          role: 'assistant',
          content: t.response,
          turnId: t.id,
          turn: t.seq,
          status: t.status,
          createdAt: t.ended_at ?? t.started_at,
        })
      }
    }
    return out
  }

  async events(sessionId: string): Promise<StatusEvent[]> {
    const rows = await this.db.q
      .selectFrom('session_events')
      .selectAll()
      .where('session_id', '=', sessionId)
      .orderBy('at')
      .orderBy(sql`rowid`)
      .execute()
    return rows.map((e) => ({
      id: e.id,
      from: e.from_status,
      to: e.to_status,
      cause: e.cause,
      detail: e.detail,
      at: e.at,
    }))
  }

  /** Copies a parent's transcript up to a turn into a fork (new turn IDs, same content). */
  async copyIntoFork(parentId: string, childId: string, upTo: number, snapshotId: string): Promise<void> {
    const turns = (await this.turnRows(parentId)).filter((t) => t.seq <= upTo)
    let messages = 0
    for (const t of turns) {
      await this.db.q
        .insertInto('turns')
        .values({
          id: newId('turn'),
          session_id: childId,
          seq: t.seq,
          status: t.status,
          prompt: t.prompt,
          response: t.response,
          stderr: t.stderr,
          sandbox_id: null,
          error_code: t.error_code,
          error_message: t.error_message,
          started_at: t.started_at,
          ended_at: t.ended_at,
          duration_ms: t.duration_ms,
        })
        .execute()
      messages += t.response ? 2 : 1
    }
    await this.db.q
      .updateTable('sessions')
      .set({
        turn_count: turns.length,
        message_count: messages,
        parent_session_id: parentId,
        forked_from_snapshot_id: snapshotId,
      })
      .where('id', '=', childId)
      .execute()
  }

  /** Forgets a session's conversation (an ephemeral session that did not ask to keep it). */
  async deleteTranscript(sessionId: string): Promise<void> {
    await this.db.transaction(async () => {
      await this.db.q
        .deleteFrom('turn_events')
        .where('turn_id', 'in', (eb) =>
          eb.selectFrom('turns').select('id').where('session_id', '=', sessionId),
        )
        .execute()
      await this.db.q.deleteFrom('turns').where('session_id', '=', sessionId).execute()
      await this.db.q.updateTable('sessions').set({ message_count: 0 }).where('id', '=', sessionId).execute()
    })
  }

  /**
   * Forgets the stored stream events of a session's turns (a deleted session's streams are not
   * resumed; its turns stay, its transcript too).
   */
  async deleteTurnEvents(sessionId: string): Promise<void> {
    await this.db.q
      .deleteFrom('turn_events')
      .where('turn_id', 'in', (eb) => eb.selectFrom('turns').select('id').where('session_id', '=', sessionId))
      .execute()
  }
}

/** A turn as `turnById` reads it: its session, and the error a failed turn ended with. */
export interface StoredTurn extends TurnInfo {
  sessionId: string
  error: { code: string; message: string } | null
}

function toTurnInfo(t: TurnRow): TurnInfo {
  return {
    id: t.id,
    seq: t.seq,
    status: t.status,
    prompt: t.prompt,
    response: t.response,
    stderrTail: t.stderr,
    sandboxId: t.sandbox_id,
    startedAt: t.started_at,
    endedAt: t.ended_at,
    durationMs: t.duration_ms === null ? null : Number(t.duration_ms),
  }
}
