import { rm } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem, type CommandEndCause, KEPT_ENDED_COMMANDS } from '@cairn/protocol'
import type { AgentProcess } from '../agent/agent-process.js'
import type { SandboxExecProcess } from '../sandbox/driver.js'
import type { Logger } from '../util/logger.js'
import { RedactingByteStream, Redactor } from '../util/redaction.js'
import { CommandLog, type OutputStream } from './command-log.js'

/** A command to start in a session's warm sandbox (see `RuntimePort.startCommand`). */
export interface CommandStart {
  sessionId: string
  commandId: string
  command: string[]
  /** Variables added to the agent's environment. */
  env?: Record<string, string> | undefined
  /** The directory it runs in, inside the sandbox (absolute, under /workspace). */
  cwd: string
  timeoutMs: number
  /** The bound of its output log (the newest bytes are kept). */
  maxOutputBytes: number
  /** Keep stdin open for writes (else it is closed at once). */
  stdin: boolean
  /** Run it on a terminal of this size (its output is all stdout). */
  tty?: { rows: number; cols: number } | undefined
  /** Once it ends (the last of the session's), the sandbox cools down for this long. */
  keepWarmMs: number
  /** Secret values (name → value) redacted from its output before it is kept, as in transcripts. */
  redact?: Record<string, string> | undefined
}

/** A command as its node knows it. */
export interface CommandState {
  commandId: string
  sessionId: string
  status: 'running' | 'exited'
  exitCode: number | null
  signal: string | null
  endCause: CommandEndCause | null
  outputBytes: number
  keptFromOffset: number
  stdinOpen: boolean
  endedAt: string | null
}

/** A read of a command's output (see `RuntimePort.readCommand`). */
export interface CommandReadRequest {
  sessionId: string
  commandId: string
  /** The byte offset to read from. */
  offset: number
  maxBytes: number
  /** A read of a running command that finds nothing new waits this long for output or its end. */
  waitMs: number
}

/** What a read of a command's output found (see `CommandLog.read`), with the command's state. */
export interface CommandRead {
  state: CommandState
  gap?: { from: number; to: number } | undefined
  chunks: { stream: 'stdout' | 'stderr'; offset: number; data: Uint8Array }[]
  nextOffset: number
}

/** The most one read of a command's output returns. */
export const MAX_READ_BYTES = 256 * 1024

interface Running {
  state: CommandState
  log: CommandLog
  process: SandboxExecProcess | undefined
  /** Whether it runs on a terminal (started with `tty`): only then can it be resized. */
  tty: boolean
  /** Why it is being ended, when the runtime ends it (a timeout, its sandbox stopping). */
  ending: CommandEndCause | undefined
  waiters: Set<() => void>
  timer: NodeJS.Timeout | undefined
  ended: Promise<void>
}

/**
 * The commands run in sessions' sandboxes on this node, beside their agents: each one's process,
 * its bounded output log under the node's data dir, its state. A command's sandbox stays warm
 * while it runs (`running`); when the last one of a session ends, `onIdle` restarts the
 * sandbox's keep-warm window.
 */
export class NodeCommands {
  private readonly commands = new Map<string, Running>()

  constructor(
    private readonly dir: string,
    private readonly logger: Logger,
    private readonly onIdle: (sessionId: string, keepWarmMs: number) => void,
  ) {}

  /** Whether a command of the session runs (its sandbox's cooldown waits). */
  running(sessionId: string): boolean {
    for (const command of this.commands.values())
      if (command.state.sessionId === sessionId && command.state.status === 'running') return true
    return false
  }

  async start(agent: AgentProcess, start: CommandStart): Promise<CommandState> {
    if (this.commands.has(start.commandId))
      throw new CairnProblem('conflict', `command ${start.commandId} exists already`)
    const log = new CommandLog(path.join(this.dir, start.sessionId, start.commandId), start.maxOutputBytes)
    const state: CommandState = {
      commandId: start.commandId,
      sessionId: start.sessionId,
      status: 'running',
      exitCode: null,
      signal: null,
      endCause: null,
      outputBytes: 0,
      keptFromOffset: 0,
      stdinOpen: start.stdin,
      endedAt: null,
    }
    let process: SandboxExecProcess
    try {
      process = await agent.exec(start.command, start.env ?? {}, start.cwd, start.tty)
    } catch (error) {
      log.remove()
      throw error
    }
    const command: Running = {
      state,
      log,
      process,
      tty: start.tty !== undefined,
      ending: undefined,
      waiters: new Set(),
      timer: undefined,
      ended: Promise.resolve(),
    }
    this.commands.set(start.commandId, command)
    const wake = () => {
      state.outputBytes = log.size
      state.keptFromOffset = log.keptFrom
      for (const waiter of command.waiters) waiter()
      command.waiters.clear()
    }
    const output = outputStreams(start.redact)
    process.stdout.on('data', (chunk: Buffer) => {
      log.append('stdout', output.stdout(chunk))
      wake()
    })
    process.stderr.on('data', (chunk: Buffer) => {
      log.append('stderr', output.stderr(chunk))
      wake()
    })
    if (!start.stdin) process.stdin.end()
    command.timer = setTimeout(() => this.end(command, 'timeout'), start.timeoutMs)
    command.timer.unref()
    command.ended = process.exited.then(({ code, signal }) => {
      clearTimeout(command.timer)
      // What redaction held back (a possible start of a value) is kept before the end is told.
      for (const [stream, rest] of output.end()) log.append(stream, rest)
      state.status = 'exited'
      state.exitCode = signal ? null : code
      state.signal = signal
      // A sandbox that went on its own (its agent crashed) took the command with it.
      state.endCause = command.ending ?? (!agent.alive ? 'sandbox_stopped' : signal ? 'signal' : 'exit')
      state.stdinOpen = false
      state.endedAt = new Date().toISOString()
      command.process = undefined
      wake()
      this.retain(start.sessionId)
      if (!this.running(start.sessionId)) this.onIdle(start.sessionId, start.keepWarmMs)
    })
    return { ...state }
  }

  private end(command: Running, cause: CommandEndCause): void {
    if (command.state.status !== 'running') return
    command.ending ??= cause
    command.process?.signal('SIGKILL')
  }

  private get(sessionId: string, commandId: string): Running {
    const command = this.commands.get(commandId)
    if (!command || command.state.sessionId !== sessionId)
      throw new CairnProblem(
        'command_not_found',
        `no command ${commandId} of session ${sessionId} on this node (its log is kept while its session's last ${KEPT_ENDED_COMMANDS} commands include it)`,
      )
    return command
  }

  state(sessionId: string, commandId: string): CommandState {
    return { ...this.get(sessionId, commandId).state }
  }

  /**
   * Output from `offset`, up to `maxBytes`; with `waitMs`, a read that finds nothing new of a
   * running command waits that long for a byte or the end first.
   */
  async read(request: CommandReadRequest): Promise<CommandRead> {
    const { offset, maxBytes, waitMs } = request
    const command = this.get(request.sessionId, request.commandId)
    if (waitMs > 0 && command.state.status === 'running' && command.log.size <= offset) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, waitMs)
        function done() {
          clearTimeout(timer)
          command.waiters.delete(done)
          resolve()
        }
        command.waiters.add(done)
      })
    }
    const read = command.log.read(offset, Math.min(maxBytes, MAX_READ_BYTES))
    return { state: { ...command.state }, ...read }
  }

  writeInput(sessionId: string, commandId: string, data: Uint8Array, close: boolean): Promise<CommandState> {
    const command = this.get(sessionId, commandId)
    const { process, state } = command
    if (close && data.length === 0 && (!process || !state.stdinOpen)) return Promise.resolve({ ...state })
    if (!process || !state.stdinOpen)
      throw new CairnProblem('conflict', `command ${commandId}'s stdin is closed`)
    return new Promise((resolve, reject) => {
      const finish = (error?: Error | null) => {
        if (error)
          return reject(new CairnProblem('conflict', `command ${commandId}'s stdin: ${error.message}`))
        if (close) {
          state.stdinOpen = false
          process.stdin.end()
        }
        resolve({ ...state })
      }
      if (data.length === 0) return finish()
      process.stdin.write(data, finish)
    })
  }

  resize(sessionId: string, commandId: string, rows: number, cols: number): CommandState {
    const command = this.get(sessionId, commandId)
    // Without a terminal there is nothing to resize: said, not ignored.
    if (!command.tty)
      throw new CairnProblem(
        'conflict',
        `command ${commandId} has no terminal: start it with tty to resize it`,
      )
    command.process?.resize(rows, cols)
    return { ...command.state }
  }

  signal(sessionId: string, commandId: string, signal: NodeJS.Signals): CommandState {
    const command = this.get(sessionId, commandId)
    if (command.state.status === 'running') command.process?.signal(signal)
    return { ...command.state }
  }

  /**
   * The session's sandbox is stopping: its running commands end with it (their cause says so);
   * resolves once each has ended.
   */
  async sandboxStopping(sessionId: string): Promise<void> {
    const ending: Promise<void>[] = []
    for (const command of this.commands.values()) {
      if (command.state.sessionId !== sessionId || command.state.status !== 'running') continue
      command.ending ??= 'sandbox_stopped'
      ending.push(command.ended)
    }
    await Promise.all(ending)
  }

  /** Keeps the logs of the session's last `KEPT_ENDED_COMMANDS` ended commands. */
  private retain(sessionId: string): void {
    const ended = [...this.commands.values()].filter(
      (c) => c.state.sessionId === sessionId && c.state.status === 'exited',
    )
    for (const old of ended.slice(0, Math.max(0, ended.length - KEPT_ENDED_COMMANDS))) this.drop(old)
  }

  private drop(command: Running): void {
    this.commands.delete(command.state.commandId)
    try {
      command.log.remove()
    } catch (error) {
      this.logger.warn({ err: error, command: command.state.commandId }, "removing a command's log failed")
    }
  }

  /** Forgets the session's commands and their logs (its workspace was deleted). */
  async forget(sessionId: string): Promise<void> {
    await this.sandboxStopping(sessionId)
    for (const command of [...this.commands.values()])
      if (command.state.sessionId === sessionId) this.drop(command)
    await rm(path.join(this.dir, sessionId), { recursive: true, force: true })
  }

  /** Removes every log (at start: the commands of an earlier process died with their sandboxes). */
  async clear(): Promise<void> {
    await rm(this.dir, { recursive: true, force: true })
  }
}

/** A command's stdout and stderr on their way to its log, each redacted of `secrets` as it comes. */
function outputStreams(secrets: Record<string, string> | undefined) {
  const redactor = new Redactor(secrets ?? {}, { bytes: true })
  if (redactor.longestForm === 0) {
    const same = (chunk: Buffer) => chunk
    return { stdout: same, stderr: same, end: (): [OutputStream, Buffer][] => [] }
  }
  const stdout = new RedactingByteStream(redactor)
  const stderr = new RedactingByteStream(redactor)
  return {
    stdout: (chunk: Buffer) => stdout.write(chunk),
    stderr: (chunk: Buffer) => stderr.write(chunk),
    end: (): [OutputStream, Buffer][] => [
      ['stdout', stdout.end()],
      ['stderr', stderr.end()],
    ],
  }
}
