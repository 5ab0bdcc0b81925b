import {
  type Message,
  type NetworkEventInfo,
  newId,
  type SessionInfo,
  type SessionPolicy,
  type SessionStatus,
  type StatusCause,
  type StatusEvent,
  type TurnInfo,
  type TurnStatus,
} from '@cairn/protocol'
import type { NetworkEvent } from '@cairn/runtime/port'
import type { Statement } from 'better-sqlite3'
import type { Db } from '../db/database.js'
import { policyOf } from './policy.js'

export interface SessionRow {
  id: string
  tenant_id: string
  agent_id: string
  agent_name: string
  revision_id: string
  title: string | null
  status: SessionStatus
  status_cause: string
  turn_count: number
  message_count: number
  idle_timeout_ms: number
  keep_warm_ms: number
  created_at: string
  updated_at: string
  last_active_at: string
  generation: number
  parent_session_id: string | null
  forked_from_snapshot_id: string | null
  auto_snapshots: number
  lease_until: string | null
  network_json: string | null
  ephemeral: number
  keep_transcript: number
  max_turns: number | null
  max_duration_ms: number | null
  deadline_at: string | null
  on_timeout: string
}

interface TurnRow {
  id: string
  session_id: string
  seq: number
  status: TurnStatus
  prompt: string
  response: string
  stderr: string
  sandbox_id: string | null
  error_code: string | null
  error_message: string | null
  started_at: string
  ended_at: string | null
  duration_ms: number | null
}

const SESSION_SELECT = `SELECT s.*, a.name AS agent_name FROM sessions s JOIN agents a ON a.id = s.agent_id`

export interface InterruptedTurn {
  sessionId: string
  tenantId: string
  seq: number
}

export interface ListFilter {
  agentId?: string | undefined
  status?: SessionStatus | undefined
  limit: number
  cursor?: { createdAt: string; id: string } | undefined
}

/** Sessions, turns and status events. Statements are prepared once. */
export class SessionStore {
  private readonly s

  private readonly timingListeners: ((sessionId: string) => void)[] = []

  constructor(private readonly db: Db) {
    this.s = {
      get: db.prepare<[string, string], SessionRow>(`${SESSION_SELECT} WHERE s.tenant_id = ? AND s.id = ?`),
      insert: db.prepare(
        `INSERT INTO sessions (id, tenant_id, agent_id, revision_id, title, status, status_cause, idle_timeout_ms, keep_warm_ms, max_turns, max_duration_ms, deadline_at, on_timeout, auto_snapshots, network_json, ephemeral, keep_transcript, generation, created_at, updated_at, last_active_at)
         VALUES (@id, @tenant_id, @agent_id, @revision_id, @title, @status, @status_cause, @idle_timeout_ms, @keep_warm_ms, @max_turns, @max_duration_ms, @deadline_at, @on_timeout, @auto_snapshots, @network_json, @ephemeral, @keep_transcript, @generation, @created_at, @created_at, @created_at)`,
      ),
      setStatus: db.prepare('UPDATE sessions SET status = ?, status_cause = ?, updated_at = ? WHERE id = ?'),
      insertEvent: db.prepare(
        'INSERT INTO session_events (id, session_id, from_status, to_status, cause, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?)',
      ),
      events: db.prepare<
        [string],
        {
          id: string
          from_status: string | null
          to_status: string
          cause: string
          detail: string | null
          at: string
        }
      >('SELECT * FROM session_events WHERE session_id = ? ORDER BY at, rowid'),
      resolve: db.prepare<[string, string, string, number], { id: string }>(
        `SELECT id FROM sessions WHERE tenant_id = ? AND id >= ? AND id < ? AND status != 'deleted' ORDER BY id LIMIT ?`,
      ),
      insertTurn: db.prepare(
        `INSERT INTO turns (id, session_id, seq, status, prompt, started_at) VALUES (?, ?, ?, 'running', ?, ?)`,
      ),
      startTurnOnSession: db.prepare(
        `UPDATE sessions SET turn_count = turn_count + 1, message_count = message_count + 1, title = COALESCE(title, ?), last_active_at = ?, updated_at = ? WHERE id = ?`,
      ),
      setTurnSandbox: db.prepare('UPDATE turns SET sandbox_id = ?, cold_start = ? WHERE id = ?'),
      finishTurn: db.prepare(
        `UPDATE turns SET status = @status, response = @response, stderr = @stderr, error_code = @error_code, error_message = @error_message, ended_at = @ended_at, duration_ms = @duration_ms WHERE id = @id`,
      ),
      finishTurnOnSession: db.prepare(
        `UPDATE sessions SET message_count = message_count + ?, last_active_at = ?, updated_at = ? WHERE id = ?`,
      ),
      turns: db.prepare<[string], TurnRow>('SELECT * FROM turns WHERE session_id = ? ORDER BY seq'),
      touch: db.prepare('UPDATE sessions SET last_active_at = ? WHERE id = ?'),
      interruptTurns: db.prepare(
        `UPDATE turns SET status = 'interrupted', ended_at = ?, error_code = 'internal', error_message = 'the server stopped while this turn ran' WHERE status = 'running'`,
      ),
      activeSessions: db.prepare<[], { id: string; status: SessionStatus }>(
        `SELECT id, status FROM sessions WHERE status = 'active'`,
      ),
      idleSessions: db.prepare<
        [],
        {
          id: string
          tenant_id: string
          last_active_at: string
          idle_timeout_ms: number
          lease_until: string | null
        }
      >(
        `SELECT id, tenant_id, last_active_at, idle_timeout_ms, lease_until FROM sessions WHERE status = 'idle'`,
      ),
      setLease: db.prepare('UPDATE sessions SET lease_until = ?, last_active_at = ? WHERE id = ?'),
      liveIds: db.prepare<
        [],
        { id: string; tenant_id: string; status: SessionStatus; status_cause: string; generation: number }
      >(`SELECT id, tenant_id, status, status_cause, generation FROM sessions WHERE status != 'deleted'`),
      // Per turn (and per file written through the API): prepared once.
      setGeneration: db.prepare('UPDATE sessions SET generation = MAX(generation, ?) WHERE id = ?'),
      generationOf: db.prepare<[string], { generation: number }>(
        'SELECT generation FROM sessions WHERE id = ?',
      ),
      insertNetwork: db.prepare(
        'INSERT INTO network_events (session_id, at, host, port, method, allowed, reason, address) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
      ),
      timingOf: db.prepare<[string], SessionTiming>(
        `SELECT status, last_active_at, idle_timeout_ms, lease_until, deadline_at FROM sessions WHERE id = ?`,
      ),
      timings: db.prepare<[], SessionTiming>(
        `SELECT status, last_active_at, idle_timeout_ms, lease_until, deadline_at FROM sessions WHERE status IN ('idle', 'active')`,
      ),
      pastDeadline: db.prepare<[string], { id: string; tenant_id: string }>(
        `SELECT id, tenant_id FROM sessions WHERE deadline_at IS NOT NULL AND deadline_at <= ? AND status IN ('idle', 'active')`,
      ),
    }
  }

  /**
   * Called after a change that may bring a session's next timeout earlier (a new session, a
   * status change, a new policy); changes that only move it later (activity, a lease) are not
   * reported: a timer armed for the old time finds nothing due and looks again.
   */
  onTimingChange(listener: (sessionId: string) => void): void {
    this.timingListeners.push(listener)
  }

  private timingChanged(sessionId: string): void {
    for (const listener of this.timingListeners) listener(sessionId)
  }

  /** When the session next times out (idle timeout or max duration), in ms; undefined: never. */
  dueAt(sessionId: string): number | undefined {
    const row = this.s.timingOf.get(sessionId)
    return row === undefined ? undefined : dueOf(row)
  }

  /** The earliest timeout of any idle or active session, in ms; undefined: none. */
  nextDue(): number | undefined {
    let next: number | undefined
    for (const row of this.s.timings.all()) {
      const due = dueOf(row)
      if (due !== undefined && (next === undefined || due < next)) next = due
    }
    return next
  }

  get(tenantId: string, id: string): SessionRow | undefined {
    return this.s.get.get(tenantId, id)
  }

  insert(
    row: Omit<
      SessionRow,
      | 'agent_name'
      | 'turn_count'
      | 'message_count'
      | 'updated_at'
      | 'last_active_at'
      | 'generation'
      | 'parent_session_id'
      | 'forked_from_snapshot_id'
      | 'auto_snapshots'
      | 'lease_until'
      | 'network_json'
      | 'ephemeral'
      | 'keep_transcript'
    > & {
      auto_snapshots?: number
      network_json?: string | null
      ephemeral?: number
      keep_transcript?: number
      generation?: number
    },
    fork?: { parentId: string; snapshotId: string; turnsUpTo: number },
  ): void {
    this.db.transaction(() => {
      this.s.insert.run({
        auto_snapshots: 1,
        network_json: null,
        ephemeral: 0,
        keep_transcript: 1,
        generation: 0,
        ...row,
      })
      this.s.insertEvent.run(
        newId('event'),
        row.id,
        null,
        row.status,
        row.status_cause,
        fork ? `forked from ${fork.parentId} at ${fork.snapshotId}` : null,
        row.created_at,
      )
      if (fork) this.copyTurns(fork.parentId, row.id, fork.turnsUpTo, fork.snapshotId)
    })()
    this.timingChanged(row.id)
  }

  /** Copies a parent's transcript up to a turn into a fork (new turn IDs, same content). */
  private copyTurns(parentId: string, childId: string, upTo: number, snapshotId: string): void {
    const turns = this.s.turns.all(parentId).filter((t) => t.seq <= upTo)
    const insert = this.db.prepare(
      `INSERT INTO turns (id, session_id, seq, status, prompt, response, stderr, sandbox_id, error_code, error_message, started_at, ended_at, duration_ms)
       VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?)`,
    )
    let messages = 0
    for (const t of turns) {
      insert.run(
        newId('turn'),
        childId,
        t.seq,
        t.status,
        t.prompt,
        t.response,
        t.stderr,
        t.error_code,
        t.error_message,
        t.started_at,
        t.ended_at,
        t.duration_ms,
      )
      messages += t.response ? 2 : 1
    }
    this.db
      .prepare(
        'UPDATE sessions SET turn_count = ?, message_count = ?, parent_session_id = ?, forked_from_snapshot_id = ? WHERE id = ?',
      )
      .run(turns.length, messages, parentId, snapshotId, childId)
  }

  recordNetwork(sessionId: string, event: NetworkEvent): void {
    this.s.insertNetwork.run(
      sessionId,
      event.at,
      event.host,
      event.port,
      event.method,
      event.allowed ? 1 : 0,
      event.reason,
      event.address ?? null,
    )
  }

  network(sessionId: string, limit: number): NetworkEventInfo[] {
    return this.db
      .prepare<[string, number], Omit<NetworkEventInfo, 'allowed'> & { allowed: number }>(
        'SELECT at, host, port, method, allowed, reason, address FROM network_events WHERE session_id = ? ORDER BY id DESC LIMIT ?',
      )
      .all(sessionId, limit)
      .reverse()
      .map((row) => ({ ...row, allowed: row.allowed === 1 }))
  }

  /** Forgets a session's conversation (an ephemeral session that did not ask to keep it). */
  deleteTranscript(sessionId: string): void {
    this.db.transaction(() => {
      this.db.prepare('DELETE FROM turns WHERE session_id = ?').run(sessionId)
      this.db.prepare('UPDATE sessions SET message_count = 0 WHERE id = ?').run(sessionId)
    })()
  }

  /** Records the workspace generation; it only moves forward (a lower value is ignored). */
  setGeneration(sessionId: string, generation: number): void {
    this.s.setGeneration.run(generation, sessionId)
  }

  generationOf(sessionId: string): number {
    return this.s.generationOf.get(sessionId)?.generation ?? 0
  }

  /** Stores a session's lifecycle policy and the deadline `maxDurationMs` gives it. */
  setPolicy(sessionId: string, policy: SessionPolicy, deadlineAt: string | null, at: string): void {
    this.db
      .prepare(
        'UPDATE sessions SET idle_timeout_ms = ?, keep_warm_ms = ?, max_turns = ?, max_duration_ms = ?, on_timeout = ?, deadline_at = ?, updated_at = ? WHERE id = ?',
      )
      .run(
        policy.idleTimeoutMs,
        policy.keepWarmMs,
        policy.maxTurns,
        policy.maxDurationMs,
        policy.onTimeout,
        deadlineAt,
        at,
        sessionId,
      )
    this.timingChanged(sessionId)
  }

  /** Idle or active sessions whose `maxDurationMs` has run out. */
  pastDeadline(nowIso: string): { id: string; tenant_id: string }[] {
    return this.s.pastDeadline.all(nowIso)
  }

  /** Changes a session's status and records the transition with its cause, atomically. */
  transition(
    row: Pick<SessionRow, 'id' | 'status'>,
    to: SessionStatus,
    cause: StatusCause,
    at: string,
    detail?: string,
  ): void {
    this.db.transaction(() => {
      this.s.setStatus.run(to, cause, at, row.id)
      this.s.insertEvent.run(newId('event'), row.id, row.status, to, cause, detail ?? null, at)
    })()
    this.timingChanged(row.id)
  }

  /** Records an event that leaves the status as it is (a sandbox paused or restored, and why). */
  note(row: Pick<SessionRow, 'id' | 'status'>, cause: StatusCause, at: string, detail: string): void {
    this.s.insertEvent.run(newId('event'), row.id, row.status, row.status, cause, detail, at)
  }

  list(tenantId: string, filter: ListFilter): SessionRow[] {
    const where = ['s.tenant_id = ?']
    const params: (string | number)[] = [tenantId]
    if (filter.agentId) {
      where.push('s.agent_id = ?')
      params.push(filter.agentId)
    }
    if (filter.status) {
      where.push('s.status = ?')
      params.push(filter.status)
    } else {
      where.push(`s.status != 'deleted'`)
    }
    if (filter.cursor) {
      where.push('(s.created_at < ? OR (s.created_at = ? AND s.id < ?))')
      params.push(filter.cursor.createdAt, filter.cursor.createdAt, filter.cursor.id)
    }
    params.push(filter.limit)
    // One statement per filter combination, prepared once (at most eight shapes).
    const sql = `${SESSION_SELECT} WHERE ${where.join(' AND ')} ORDER BY s.created_at DESC, s.id DESC LIMIT ?`
    let statement = this.listStatements.get(sql)
    if (!statement) {
      statement = this.db.prepare<(string | number)[], SessionRow>(sql)
      this.listStatements.set(sql, statement)
    }
    return statement.all(...params)
  }

  private readonly listStatements = new Map<string, Statement<(string | number)[], SessionRow>>()

  resolvePrefix(tenantId: string, prefix: string, max: number): string[] {
    return this.s.resolve.all(tenantId, prefix, `${prefix}~`, max).map((r) => r.id)
  }

  startTurn(sessionId: string, turnId: string, seq: number, prompt: string, title: string, at: string): void {
    this.db.transaction(() => {
      this.s.insertTurn.run(turnId, sessionId, seq, prompt, at)
      this.s.startTurnOnSession.run(title, at, at, sessionId)
    })()
  }

  setTurnSandbox(turnId: string, sandboxId: string, coldStart: boolean): void {
    this.s.setTurnSandbox.run(sandboxId, coldStart ? 1 : 0, turnId)
  }

  finishTurn(
    sessionId: string,
    turn: {
      id: string
      status: TurnStatus
      response: string
      stderr: string
      errorCode: string | null
      errorMessage: string | null
      endedAt: string
      durationMs: number
    },
  ): void {
    this.db.transaction(() => {
      this.s.finishTurn.run({
        id: turn.id,
        status: turn.status,
        response: turn.response,
        stderr: turn.stderr,
        error_code: turn.errorCode,
        error_message: turn.errorMessage,
        ended_at: turn.endedAt,
        duration_ms: turn.durationMs,
      })
      this.s.finishTurnOnSession.run(turn.response ? 1 : 0, turn.endedAt, turn.endedAt, sessionId)
    })()
  }

  touch(sessionId: string, at: string): void {
    this.s.touch.run(at, sessionId)
  }

  turns(sessionId: string): TurnInfo[] {
    return this.s.turns.all(sessionId).map((t) => ({
      id: t.id,
      seq: t.seq,
      status: t.status,
      prompt: t.prompt,
      response: t.response,
      stderrTail: t.stderr,
      sandboxId: t.sandbox_id,
      startedAt: t.started_at,
      endedAt: t.ended_at,
      durationMs: t.duration_ms,
    }))
  }

  messages(sessionId: string): Message[] {
    const out: Message[] = []
    for (const t of this.s.turns.all(sessionId)) {
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

  events(sessionId: string): StatusEvent[] {
    return this.s.events.all(sessionId).map((e) => ({
      id: e.id,
      from: e.from_status,
      to: e.to_status,
      cause: e.cause,
      detail: e.detail,
      at: e.at,
    }))
  }

  /**
   * After a crash: running turns become `interrupted` and active sessions go back to `idle`.
   * Returns the interrupted turns (for the check of their pre-turn snapshots).
   */
  recoverAfterRestart(at: string): { sessions: number; turns: InterruptedTurn[] } {
    return this.db.transaction(() => {
      const turns = this.db
        .prepare<[], InterruptedTurn>(
          `SELECT t.session_id AS sessionId, s.tenant_id AS tenantId, t.seq AS seq FROM turns t JOIN sessions s ON s.id = t.session_id WHERE t.status = 'running'`,
        )
        .all()
      this.s.interruptTurns.run(at)
      const active = this.s.activeSessions.all()
      for (const row of active)
        this.transition(row, 'idle', 'server_restart', at, 'the server restarted while a turn ran')
      return { sessions: active.length, turns }
    })()
  }

  /** Idle sessions past their idle timeout and not held by a lease. */
  expiredIdle(nowMs: number): { id: string; tenant_id: string }[] {
    return this.s.idleSessions
      .all()
      .filter(
        (r) =>
          Date.parse(r.last_active_at) + r.idle_timeout_ms <= nowMs &&
          !(r.lease_until && Date.parse(r.lease_until) > nowMs),
      )
  }

  setLease(sessionId: string, until: string, at: string): void {
    this.s.setLease.run(until, at, sessionId)
  }

  liveSessions(): {
    id: string
    tenant_id: string
    status: SessionStatus
    status_cause: string
    generation: number
  }[] {
    return this.s.liveIds.all()
  }
}

export function toSessionInfo(row: SessionRow, warm: boolean): SessionInfo {
  return {
    id: row.id,
    agentId: row.agent_id,
    agentName: row.agent_name,
    revisionId: row.revision_id,
    title: row.title,
    status: row.status,
    statusCause: row.status_cause,
    turnCount: row.turn_count,
    messageCount: row.message_count,
    idleTimeoutMs: row.idle_timeout_ms,
    keepWarmMs: row.keep_warm_ms,
    policy: policyOf(row),
    deadlineAt: row.deadline_at,
    generation: row.generation,
    autoSnapshots: row.auto_snapshots !== 0,
    ephemeral: row.ephemeral === 1,
    warm,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    lastActiveAt: row.last_active_at,
  }
}

interface SessionTiming {
  status: SessionStatus
  last_active_at: string
  idle_timeout_ms: number
  lease_until: string | null
  deadline_at: string | null
}

/** An idle session times out at its idle timeout (held off by a lease); idle or active, at its deadline. */
function dueOf(row: SessionTiming): number | undefined {
  let due: number | undefined
  if (row.status === 'idle') {
    const idleDue = Date.parse(row.last_active_at) + row.idle_timeout_ms
    due = row.lease_until ? Math.max(idleDue, Date.parse(row.lease_until)) : idleDue
  }
  if (row.deadline_at && (row.status === 'idle' || row.status === 'active')) {
    const deadline = Date.parse(row.deadline_at)
    due = due === undefined ? deadline : Math.min(due, deadline)
  }
  return due
}
