import {
  CairnProblem,
  type CommandInfo,
  DEFAULT_COMMAND_OUTPUT_BYTES,
  DEFAULT_COMMAND_TIMEOUT_MS,
  newId,
  type StartCommandBody,
} from '@cairn/protocol'
import type { CommandRead, CommandState, RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import type { StorageBudget } from '../limits/storage-budget.js'
import type { SecretStore } from '../secrets/secret-store.js'
import type { SessionService } from '../sessions/session-service.js'
import type { SessionRow } from '../sessions/session-store.js'
import { type CommandRow, CommandStore, toCommandInfo } from './command-store.js'

/** How long one wait of the watcher (and of a follower's read) holds at the node for news. */
export const COMMAND_WAIT_MS = 10_000
/** A watcher that cannot reach the node tries again after this long. */
const RETRY_MS = 2_000
/** Commands a session's list shows. */
const LIST_LIMIT = 100
/** Session statuses a command may start in: a session that ended is resumed first. */
const OPEN_STATUSES = new Set(['idle', 'active'])
/** Errors that mean the node keeps nothing of the command any more. */
const GONE = new Set(['command_not_found', 'node_lost', 'state_lost'])

export interface CommandServiceDeps {
  db: Db
  sessions: SessionService
  /** The agent's secret values, redacted from a command's output as from a turn's transcript. */
  secrets: Pick<SecretStore, 'values'>
  /** The runtime, only through its port. */
  runtime: Pick<
    RuntimePort,
    'startCommand' | 'readCommand' | 'writeCommandInput' | 'signalCommand' | 'resizeCommand'
  >
  clock: Clock
  logger: Logger
  /** The tenant's storage budget: a command's log is reserved at its bound before it starts. */
  budget?: StorageBudget | undefined
}

/** `cwd` of a start body as the sandbox sees it: under /workspace, no `..`. */
export function commandCwd(cwd: string | undefined): string {
  const rel = (cwd ?? '').replace(/^\/workspace(\/|$)/, '').replace(/^\/+|\/+$/g, '')
  if (rel === '') return '/workspace'
  const parts = rel.split('/').filter((p) => p !== '' && p !== '.')
  if (
    parts.some((p) => p === '..') ||
    rel.includes('\0') ||
    (cwd?.startsWith('/') && !cwd.startsWith('/workspace'))
  )
    throw new CairnProblem(
      'validation_failed',
      `cwd must be a directory under /workspace: ${JSON.stringify(cwd)}`,
    )
  return `/workspace/${parts.join('/')}`
}

/**
 * Commands in a session's sandbox outside turns (docs/commands.md): started through the runtime
 * port beside the agent (the sandbox started as a turn would start it), their rows in the
 * database for every replica, their output read from the node by offset. The replica that starts a
 * command watches it to its end (the session stays active meanwhile, and its end is recorded);
 * any replica that reads a command the watcher lost finishes the record from the node.
 */
export class CommandService {
  readonly store: CommandStore
  private readonly watching = new Set<string>()
  private closed = false

  constructor(private readonly deps: CommandServiceDeps) {
    this.store = new CommandStore(deps.db)
  }

  private now(): string {
    return iso(this.deps.clock.now())
  }

  async start(tenantId: string, sessionId: string, body: StartCommandBody): Promise<CommandInfo> {
    const cwd = commandCwd(body.cwd)
    const current = await this.deps.sessions.requireLive(tenantId, sessionId)
    this.requireOpen(current)
    const row = await this.deps.sessions.ensureSandbox(tenantId, sessionId)
    const id = newId('command')
    const timeoutMs = body.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS
    const command: CommandRow = {
      id,
      session_id: row.id,
      tenant_id: tenantId,
      command_json: JSON.stringify(body.command),
      cwd,
      status: 'running',
      exit_code: null,
      signal: null,
      end_cause: null,
      output_bytes: 0,
      kept_from_offset: 0,
      stdin_open: body.stdin || body.tty ? 1 : 0,
      timeout_ms: timeoutMs,
      max_output_bytes: DEFAULT_COMMAND_OUTPUT_BYTES,
      started_at: this.now(),
      ended_at: null,
    }
    // The row first: a command never runs unrecorded (a start that fails removes it). Its log's
    // bound is reserved in the tenant's budget first, and the row (which counts it) settles that.
    const budget = this.deps.budget
    if (budget) {
      const reservation = await budget.reserve(
        tenantId,
        DEFAULT_COMMAND_OUTPUT_BYTES,
        "a command's output log",
      )
      await budget.settle(reservation, () => this.store.insert(command))
    } else await this.store.insert(command)
    try {
      await this.deps.runtime.startCommand({
        sessionId: row.id,
        commandId: id,
        command: body.command,
        env: body.env,
        cwd,
        timeoutMs,
        maxOutputBytes: DEFAULT_COMMAND_OUTPUT_BYTES,
        // A terminal's keyboard is its stdin: open.
        stdin: body.stdin === true || body.tty !== undefined,
        tty: body.tty,
        keepWarmMs: row.keep_warm_ms,
        redact: await this.deps.secrets.values(row.agent_id, ['runtime', 'setup', 'proxy']),
      })
    } catch (error) {
      await this.store.delete(id)
      // A session deleted meanwhile took its sandbox: said as such, not as sandbox_not_running.
      const gone = await this.deps.sessions.missingWorkspace(tenantId, row.id)
      throw gone.code === 'session_deleted' ? gone : error
    }
    this.deps.sessions.noteActivity(row)
    await this.deps.sessions.store.note(
      row,
      'command_started',
      this.now(),
      `${id}: ${describe(body.command)}`,
    )
    this.watch(row, id)
    return toCommandInfo(command)
  }

  private requireOpen(row: SessionRow): void {
    if (!OPEN_STATUSES.has(row.status))
      throw new CairnProblem(
        'conflict',
        `session ${row.id} is ${row.status}: resume it (cairn sessions resume ${row.id}) to run commands in it`,
        { status: row.status },
      )
  }

  async list(tenantId: string, sessionId: string): Promise<CommandInfo[]> {
    await this.deps.sessions.require(tenantId, sessionId)
    const rows = await this.store.list(sessionId, LIST_LIMIT)
    return Promise.all(rows.map(async (row) => toCommandInfo(await this.refresh(row))))
  }

  async get(tenantId: string, sessionId: string, commandId: string): Promise<CommandInfo> {
    return toCommandInfo(await this.refresh(await this.require(tenantId, sessionId, commandId)))
  }

  private async require(tenantId: string, sessionId: string, commandId: string): Promise<CommandRow> {
    await this.deps.sessions.require(tenantId, sessionId)
    const row = await this.store.get(sessionId, commandId)
    if (!row) throw new CairnProblem('command_not_found', `No command '${commandId}' in session ${sessionId}`)
    return row
  }

  /** A running command's row brought up to date from its node (ended, or lost with it). */
  private async refresh(row: CommandRow): Promise<CommandRow> {
    if (row.status !== 'running') return row
    try {
      const read = await this.deps.runtime.readCommand({
        sessionId: row.session_id,
        commandId: row.id,
        offset: Number(row.output_bytes),
        maxBytes: 0,
        waitMs: 0,
      })
      return (await this.record(row, read.state)) ?? row
    } catch (error) {
      if (!isGone(error)) throw error
      return (await this.lose(row)) ?? row
    }
  }

  /**
   * Output from `offset` (see `RuntimePort.readCommand`); `waitMs`: a read that finds nothing new
   * waits that long. The row follows what the node says (its end recorded once, by whoever sees it).
   */
  async read(
    tenantId: string,
    sessionId: string,
    commandId: string,
    offset: number,
    maxBytes: number,
    waitMs: number,
  ): Promise<{ read: CommandRead | undefined; command: CommandRow }> {
    const row = await this.require(tenantId, sessionId, commandId)
    try {
      const read = await this.deps.runtime.readCommand({ sessionId, commandId, offset, maxBytes, waitMs })
      return { read, command: (await this.record(row, read.state)) ?? row }
    } catch (error) {
      if (!isGone(error)) throw error
      return { read: undefined, command: (await this.lose(row)) ?? row }
    }
  }

  async stdin(
    tenantId: string,
    sessionId: string,
    commandId: string,
    data: Buffer,
    close: boolean,
  ): Promise<CommandInfo> {
    const row = await this.require(tenantId, sessionId, commandId)
    // Closing what is closed already (or a command's that has ended) changes nothing: a terminal
    // sends its `close` when its input ends, which can come after the command's own end.
    const closeOnly = close && data.length === 0
    if (closeOnly && (row.status !== 'running' || Number(row.stdin_open) !== 1)) return toCommandInfo(row)
    if (row.status !== 'running')
      throw new CairnProblem('conflict', `command ${commandId} has ended`, { status: row.status })
    const state = await this.deps.runtime.writeCommandInput(sessionId, commandId, data, close)
    return toCommandInfo((await this.record(row, state)) ?? row)
  }

  /** Resizes the terminal of a command started with `tty`. */
  async resize(
    tenantId: string,
    sessionId: string,
    commandId: string,
    size: { rows: number; cols: number },
  ): Promise<CommandInfo> {
    const row = await this.require(tenantId, sessionId, commandId)
    if (row.status !== 'running') return toCommandInfo(row)
    const state = await this.deps.runtime.resizeCommand(sessionId, commandId, size)
    return toCommandInfo((await this.record(row, state)) ?? row)
  }

  async signal(tenantId: string, sessionId: string, commandId: string, signal: string): Promise<CommandInfo> {
    const row = await this.require(tenantId, sessionId, commandId)
    if (row.status !== 'running') return toCommandInfo(row)
    const state = await this.deps.runtime.signalCommand(sessionId, commandId, signal)
    return toCommandInfo((await this.record(row, state)) ?? row)
  }

  /** Brings the row to the node's state: its figures, or its end (recorded once, with an event). */
  private async record(row: CommandRow, state: CommandState): Promise<CommandRow | undefined> {
    const figures = { output_bytes: state.outputBytes, kept_from_offset: state.keptFromOffset }
    if (state.status === 'running') {
      await this.store.progress(row.id, state)
      return { ...row, ...figures, stdin_open: state.stdinOpen ? 1 : 0 }
    }
    const end = {
      status: 'exited',
      exit_code: state.exitCode,
      signal: state.signal,
      end_cause: state.endCause,
      ended_at: state.endedAt ?? this.now(),
      ...figures,
    }
    if (await this.store.end(row.id, end)) await this.noteEnd(row, describeEnd(state))
    return this.store.get(row.session_id, row.id)
  }

  /** The node keeps nothing of a running command (it restarted, or was lost): it is `lost`. */
  private async lose(row: CommandRow): Promise<CommandRow | undefined> {
    const end = { status: 'lost', exit_code: null, signal: null, end_cause: 'lost', ended_at: this.now() }
    if (await this.store.end(row.id, end)) await this.noteEnd(row, "lost with its sandbox's node")
    return this.store.get(row.session_id, row.id)
  }

  private async noteEnd(row: CommandRow, how: string): Promise<void> {
    const status = await this.deps.sessions.store.statusOf(row.session_id)
    if (status)
      await this.deps.sessions.store.note(
        { id: row.session_id, status },
        'command_ended',
        this.now(),
        `${row.id}: ${how}`,
      )
  }

  /**
   * Follows the command on its node until it ends: the session stays active (its idle clock
   * restarts at each wait) and the end is recorded as it happens.
   */
  private watch(session: SessionRow, commandId: string): void {
    this.watching.add(commandId)
    void (async () => {
      let offset = 0
      while (!this.closed) {
        const row = await this.store.get(session.id, commandId)
        if (!row || row.status !== 'running') break
        try {
          const read = await this.deps.runtime.readCommand({
            sessionId: session.id,
            commandId,
            offset,
            maxBytes: 0,
            waitMs: COMMAND_WAIT_MS,
          })
          offset = read.state.outputBytes
          this.deps.sessions.noteActivity(session)
          await this.record(row, read.state)
          if (read.state.status !== 'running') break
        } catch (error) {
          if (isGone(error)) {
            await this.lose(row)
            break
          }
          this.deps.logger.warn({ err: error, command: commandId }, 'watching a command failed; retrying')
          await new Promise((resolve) => setTimeout(resolve, RETRY_MS).unref())
        }
      }
    })()
      .catch((error: unknown) =>
        this.deps.logger.warn({ err: error, command: commandId }, 'a command watcher failed'),
      )
      .finally(() => this.watching.delete(commandId))
  }

  close(): void {
    this.closed = true
  }
}

function isGone(error: unknown): boolean {
  return error instanceof CairnProblem && GONE.has(error.code)
}

function describe(command: readonly string[]): string {
  const text = command.map((arg) => (/^[\w@%+=:,./-]+$/.test(arg) ? arg : JSON.stringify(arg))).join(' ')
  return text.length > 200 ? `${text.slice(0, 199)}…` : text
}

function describeEnd(state: CommandState): string {
  if (state.endCause === 'timeout') return 'killed at its timeout'
  if (state.endCause === 'sandbox_stopped') return 'ended with its sandbox'
  if (state.signal) return `killed by ${state.signal}`
  return `exited with code ${state.exitCode}`
}
