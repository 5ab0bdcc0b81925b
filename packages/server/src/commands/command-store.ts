import type { CommandEndCause, CommandInfo, CommandStatus } from '@cairn/protocol'
import type { CommandState } from '@cairn/runtime/port'
import type { Db } from '../db/database.js'
import type { Schema } from '../db/schema.js'

export type CommandRow = Schema['commands']

export function toCommandInfo(row: CommandRow): CommandInfo {
  return {
    id: row.id,
    sessionId: row.session_id,
    command: JSON.parse(row.command_json) as string[],
    cwd: row.cwd,
    status: row.status as CommandStatus,
    exitCode: row.exit_code === null ? null : Number(row.exit_code),
    signal: row.signal,
    endCause: row.end_cause as CommandEndCause | null,
    outputBytes: Number(row.output_bytes),
    keptFromOffset: Number(row.kept_from_offset),
    stdinOpen: Number(row.stdin_open) === 1,
    timeoutMs: Number(row.timeout_ms),
    startedAt: row.started_at,
    endedAt: row.ended_at,
  }
}

/** The commands' rows: what every replica knows of a command (its output is on the node). */
export class CommandStore {
  constructor(private readonly db: Db) {}

  async insert(row: CommandRow): Promise<void> {
    await this.db.q.insertInto('commands').values(row).execute()
  }

  async delete(id: string): Promise<void> {
    await this.db.q.deleteFrom('commands').where('id', '=', id).execute()
  }

  get(sessionId: string, id: string): Promise<CommandRow | undefined> {
    return this.db.q
      .selectFrom('commands')
      .selectAll()
      .where('id', '=', id)
      .where('session_id', '=', sessionId)
      .executeTakeFirst()
  }

  list(sessionId: string, limit: number): Promise<CommandRow[]> {
    return this.db.q
      .selectFrom('commands')
      .selectAll()
      .where('session_id', '=', sessionId)
      .orderBy('started_at', 'desc')
      .orderBy('id', 'desc')
      .limit(limit)
      .execute()
  }

  /** The running command's figures as its node reports them (its output so far, stdin). */
  async progress(id: string, state: CommandState): Promise<void> {
    await this.db.q
      .updateTable('commands')
      .set({
        output_bytes: state.outputBytes,
        kept_from_offset: state.keptFromOffset,
        stdin_open: state.stdinOpen ? 1 : 0,
      })
      .where('id', '=', id)
      .where('status', '=', 'running')
      .execute()
  }

  /**
   * Records the command's end, once: false when another replica (or call) recorded it first, so
   * the session's event for it is written once.
   */
  async end(
    id: string,
    end: Pick<CommandRow, 'status' | 'exit_code' | 'signal' | 'end_cause' | 'ended_at'> &
      Partial<Pick<CommandRow, 'output_bytes' | 'kept_from_offset'>>,
  ): Promise<boolean> {
    const result = await this.db.q
      .updateTable('commands')
      .set({ ...end, stdin_open: 0 })
      .where('id', '=', id)
      .where('status', '=', 'running')
      .executeTakeFirst()
    return Number(result.numUpdatedRows) > 0
  }
}
