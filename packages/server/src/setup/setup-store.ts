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
  private readonly s

  constructor(db: Db) {
    this.s = {
      insert: db.prepare(
        `INSERT INTO session_setups (session_id, command_json, env_json, network_json, timeout_ms, status) VALUES (?, ?, ?, ?, ?, 'pending')`,
      ),
      get: db.prepare<[string], SetupRow>('SELECT * FROM session_setups WHERE session_id = ?'),
      start: db.prepare(
        `UPDATE session_setups SET status = 'running', attempts = attempts + 1, exit_code = NULL, error = NULL, log = '', started_at = ?, ended_at = NULL WHERE session_id = ?`,
      ),
      finish: db.prepare(
        'UPDATE session_setups SET status = ?, exit_code = ?, error = ?, log = ?, ended_at = ? WHERE session_id = ?',
      ),
      setSnapshot: db.prepare('UPDATE session_setups SET snapshot_id = ? WHERE session_id = ?'),
      interrupt: db.prepare(
        `UPDATE session_setups SET status = 'failed', error = 'the server stopped while setup ran' WHERE status = 'running'`,
      ),
    }
  }

  insert(sessionId: string, setup: SessionSetup): void {
    const command = typeof setup.command === 'string' ? ['sh', '-c', setup.command] : setup.command
    this.s.insert.run(
      sessionId,
      JSON.stringify(command),
      JSON.stringify(setup.env ?? {}),
      setup.network ? JSON.stringify(setup.network) : null,
      setup.timeoutMs ?? null,
    )
  }

  get(sessionId: string): StoredSetup | undefined {
    const row = this.s.get.get(sessionId)
    if (!row) return undefined
    return {
      command: JSON.parse(row.command_json) as string[],
      env: JSON.parse(row.env_json) as Record<string, string>,
      network: row.network_json ? (JSON.parse(row.network_json) as SessionSetup['network']) : undefined,
      timeoutMs: row.timeout_ms ?? undefined,
      status: row.status,
    }
  }

  start(sessionId: string, at: string): void {
    this.s.start.run(at, sessionId)
  }

  finish(
    sessionId: string,
    result: {
      status: 'succeeded' | 'failed'
      exitCode: number | null
      error: string | null
      log: string
      at: string
    },
  ): void {
    this.s.finish.run(result.status, result.exitCode, result.error, result.log, result.at, sessionId)
  }

  setSnapshot(sessionId: string, snapshotId: string): void {
    this.s.setSnapshot.run(snapshotId, sessionId)
  }

  /** Marks setups a stopped server left running as failed (they run again on the next turn). */
  recoverAfterRestart(): number {
    return this.s.interrupt.run().changes
  }

  log(sessionId: string): string | undefined {
    return this.s.get.get(sessionId)?.log
  }

  info(sessionId: string): SetupInfo | undefined {
    const row = this.s.get.get(sessionId)
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
