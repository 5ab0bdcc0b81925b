import type { SessionSetup, SetupInfo, SetupStatus } from '@cairn/protocol'
import type { Db } from '../db/database.js'

interface SetupRow {
  session_id: string
  command_json: string
  env_json: string
  network_json: string | null
  timeout_ms: number | null
  status: SetupStatus
  attempts: number
  exit_code: number | null
  error: string | null
  log: string
  started_at: string | null
  ended_at: string | null
  snapshot_id: string | null
}

/** What a session's setup phase runs, in a normalized form. */
export interface StoredSetup {
  command: string[]
  env: Record<string, string>
  network: SessionSetup['network']
  timeoutMs: number | undefined
  status: SetupStatus
}

const LOG_TAIL_LINES = 20

/** The setup phase of each session that has one: its command, its state and its log. */
export class SetupStore {
  constructor(private readonly db: Db) {}

  async insert(sessionId: string, setup: SessionSetup): Promise<void> {
    const command = typeof setup.command === 'string' ? ['sh', '-c', setup.command] : setup.command
    await this.db.q
      .insertInto('session_setups')
      .values({
        session_id: sessionId,
        command_json: JSON.stringify(command),
        env_json: JSON.stringify(setup.env ?? {}),
        network_json: setup.network ? JSON.stringify(setup.network) : null,
        timeout_ms: setup.timeoutMs ?? null,
        status: 'pending',
      })
      .execute()
  }

  private async row(sessionId: string): Promise<SetupRow | undefined> {
    return (await this.db.q
      .selectFrom('session_setups')
      .selectAll()
      .where('session_id', '=', sessionId)
      .executeTakeFirst()) as SetupRow | undefined
  }

  async get(sessionId: string): Promise<StoredSetup | undefined> {
    const row = await this.row(sessionId)
    if (!row) return undefined
    return {
      command: JSON.parse(row.command_json) as string[],
      env: JSON.parse(row.env_json) as Record<string, string>,
      network: row.network_json ? (JSON.parse(row.network_json) as SessionSetup['network']) : undefined,
      timeoutMs: row.timeout_ms ?? undefined,
      status: row.status,
    }
  }

  async start(sessionId: string, at: string): Promise<void> {
    await this.db.q
      .updateTable('session_setups')
      .set((eb) => ({
        status: 'running',
        attempts: eb('attempts', '+', 1),
        exit_code: null,
        error: null,
        log: '',
        started_at: at,
        ended_at: null,
      }))
      .where('session_id', '=', sessionId)
      .execute()
  }

  async finish(
    sessionId: string,
    result: {
      status: 'succeeded' | 'failed'
      exitCode: number | null
      error: string | null
      log: string
      at: string
    },
  ): Promise<void> {
    await this.db.q
      .updateTable('session_setups')
      .set({
        status: result.status,
        exit_code: result.exitCode,
        error: result.error,
        log: result.log,
        ended_at: result.at,
      })
      .where('session_id', '=', sessionId)
      .execute()
  }

  async setSnapshot(sessionId: string, snapshotId: string): Promise<void> {
    await this.db.q
      .updateTable('session_setups')
      .set({ snapshot_id: snapshotId })
      .where('session_id', '=', sessionId)
      .execute()
  }

  /** Setups of `runtimeId`'s sessions that a crash left running become failed. */
  async recoverAfterRestart(runtimeId: string): Promise<number> {
    const result = await this.db.q
      .updateTable('session_setups')
      .set({ status: 'failed', error: 'the server stopped while setup ran' })
      .where('status', '=', 'running')
      .where('session_id', 'in', (eb) =>
        eb.selectFrom('sessions').select('id').where('runtime_id', '=', runtimeId),
      )
      .executeTakeFirst()
    return Number(result.numUpdatedRows)
  }

  async log(sessionId: string): Promise<string | undefined> {
    return (await this.row(sessionId))?.log
  }

  async info(sessionId: string): Promise<SetupInfo | undefined> {
    const row = await this.row(sessionId)
    if (!row) return undefined
    return {
      sessionId,
      status: row.status,
      command: JSON.parse(row.command_json) as string[],
      attempts: row.attempts,
      exitCode: row.exit_code,
      error: row.error,
      startedAt: row.started_at,
      endedAt: row.ended_at,
      snapshotId: row.snapshot_id,
      logTail: logTail(row.log),
    }
  }
}

export function logTail(log: string, lines = LOG_TAIL_LINES): string {
  const all = log.endsWith('\n') ? log.slice(0, -1).split('\n') : log.split('\n')
  return all.slice(-lines).join('\n')
}
