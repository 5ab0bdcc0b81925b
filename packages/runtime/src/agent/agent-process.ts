import { mkdir, rm } from 'node:fs/promises'
import type net from 'node:net'
import path from 'node:path'
import { AGENT_ENV, CairnProblem, newId } from '@cairn/protocol'
import type { EgressCa } from '../egress/egress-ca.js'
import { forwarderCommand } from '../egress/transparent.js'
import { egressProxyEnv, trustedCaEnv } from '../launch/launch-env.js'
import { requireCapability } from '../sandbox/capabilities.js'
import type {
  Sandbox,
  SandboxDriver,
  SandboxExecProcess,
  SandboxExit,
  SandboxSpec,
} from '../sandbox/driver.js'
import { sandboxEnv } from '../sandbox/sandbox-env.js'
import { type Logger, noopLogger } from '../util/logger.js'
import type { ActiveTurn, TurnChannel } from './active-turn.js'
import { type AgentEgress, startAgentEgress } from './agent-egress.js'
import { AgentPorts } from './agent-ports.js'
import type { OutputGate } from './output-gate.js'
import type { AgentProtocol } from './protocols/agent-protocol.js'
import { protocolFor } from './protocols/protocol-for.js'
import { RunDir } from './run-dir.js'
import { StderrTail } from './stderr-tail.js'
import {
  type AgentEvent,
  type AgentLaunch,
  type AgentMemoryState,
  DEFAULT_MAX_OUTPUT_CHARS,
  type TurnInput,
  type TurnOutcome,
} from './types.js'

const LIMIT_POLL_MS = 200

/**
 * One agent process in one sandbox, kept warm between turns (stdio, jsonl, http), or one sandbox per
 * turn (exec). Turns run one at a time; the caller (the session service) enforces that too. How
 * the agent is spoken to is its protocol's (`protocols/`); this supervises the sandbox and the turn.
 */
export class AgentProcess implements TurnChannel {
  readonly sandboxId: string
  private sandbox: Sandbox | undefined
  private readonly stderrTail = new StderrTail()
  active: ActiveTurn | undefined
  private exitInfo: SandboxExit | undefined
  private stopped = false
  private busy = false
  readonly startedAt = Date.now()
  private readonly runDir: RunDir
  private readonly protocol: AgentProtocol
  private readonly ports: AgentPorts
  private egress: AgentEgress | undefined
  readonly maxOutputChars: number

  constructor(
    private readonly driver: SandboxDriver,
    private readonly launch: AgentLaunch,
    private readonly runRoot: string,
    /** The per-install CA, loaded when an agent first needs TLS terminated for a proxy secret. */
    private readonly egressCa?: () => Promise<EgressCa>,
    private readonly logger: Logger = noopLogger,
    /** Where its stderr file goes (`instanceStderrDir`); beside its run dir by default. */
    stderrRoot: string = runRoot,
  ) {
    this.sandboxId = launch.resume?.targetId ?? newId('sandbox')
    this.runDir = new RunDir(path.join(runRoot, this.sandboxId), stderrRoot)
    this.protocol = protocolFor(launch, (port) => this.ports.connect(port), launch.resume?.state.protocol)
    this.maxOutputChars = launch.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS
    const agent = this
    this.ports = new AgentPorts(
      driver,
      {
        sandboxId: this.sandboxId,
        get alive() {
          return agent.alive
        },
        get stopped() {
          return agent.stopped
        },
        get proxied() {
          return agent.egress !== undefined
        },
        networkNamespace: async () => agent.sandbox?.networkNamespace?.(),
      },
      this.runDir.file('ports.sock'),
      logger,
    )
  }

  /**
   * Writes the warm sandbox's processes and memory to `imageDir` and stops it; the state returned
   * goes with the image into `AgentLaunch.resume`. Refused with a typed error by a driver without
   * `memorySnapshot`, for an exec agent (no process between turns) and during a turn.
   */
  async checkpoint(imageDir: string): Promise<{ state: AgentMemoryState; bytes: number }> {
    requireCapability(this.driver, 'memorySnapshot', 'checkpoint a sandbox with its memory')
    const sandbox = this.sandbox
    if (!this.protocol.warm || !sandbox || !this.alive || !this.driver.checkpoint)
      throw new CairnProblem('sandbox_not_running', 'the agent has no running sandbox to checkpoint')
    if (this.busy) throw new CairnProblem('session_busy', 'the agent is running a turn')
    const state = { protocol: this.protocol.state?.() ?? {} }
    this.busy = true
    try {
      const { bytes } = await this.driver.checkpoint(sandbox, imageDir)
      return { state, bytes }
    } finally {
      this.busy = false
      await this.stop()
    }
  }

  /** Its sandbox was started to be checkpointed (`AgentLaunch.checkpointable`). */
  get checkpointable(): boolean {
    return this.launch.checkpointable === true
  }

  /** The session this agent runs for. */
  get sessionId(): string {
    return this.launch.sessionId
  }

  get alive(): boolean {
    if (!this.protocol.warm) return !this.stopped
    return !this.stopped && this.sandbox !== undefined && this.exitInfo === undefined
  }

  /** The sandbox driver this agent runs under (`bwrap`, `gvisor`), for the session's manifest. */
  get isolation(): string {
    return this.driver.name
  }

  /**
   * Freezes the warm sandbox so a snapshot sees a consistent workspace; a driver that cannot freeze
   * refuses with a typed error rather than let a snapshot race the agent.
   */
  async freeze(): Promise<void> {
    requireCapability(this.driver, 'freeze', 'freeze a sandbox for a consistent snapshot')
    await this.sandbox?.freeze()
  }

  async thaw(): Promise<void> {
    await this.sandbox?.thaw()
  }

  /**
   * Bytes of file data the warm sandbox's processes have dirtied so far (see `Sandbox.writtenBytes`);
   * undefined for exec agents (a sandbox per turn), a stopped sandbox, or a driver that cannot tell.
   */
  writtenBytes(): number | undefined {
    if (!this.protocol.warm || !this.alive) return undefined
    return this.sandbox?.writtenBytes?.()
  }

  get pid(): number | undefined {
    return this.sandbox?.pid
  }

  /** A socket to 127.0.0.1:`port` inside the sandbox, through a relay started on first use. */
  connectPort(port: number): Promise<net.Socket> {
    return this.ports.connect(port)
  }

  /** TCP ports a service listens on inside the sandbox (empty without a running sandbox). */
  listeningPorts(): Promise<number[]> {
    return this.ports.listening()
  }

  /**
   * Runs a command in the warm sandbox beside the agent (see `Sandbox.exec`): the agent's
   * environment (its secrets, egress settings; not its protocol's shims nor the turn) plus `env`.
   */
  async exec(
    command: readonly string[],
    env: Record<string, string>,
    cwd: string,
    pty?: { rows: number; cols: number } | undefined,
  ): Promise<SandboxExecProcess> {
    if (!this.protocol.warm)
      throw new CairnProblem(
        'bad_request',
        `this agent's protocol (${this.launch.protocol}) keeps no sandbox between turns, so there is none to run a command in`,
      )
    const sandbox = this.sandbox
    if (!sandbox || !this.alive)
      throw new CairnProblem('sandbox_not_running', "the session's sandbox is not running")
    if (!sandbox.exec)
      throw new CairnProblem(
        'bad_request',
        `the ${this.driver.name} driver cannot run a command beside the agent`,
      )
    const base = sandboxEnv({
      env: {
        ...this.launch.env,
        [AGENT_ENV.sessionId]: this.launch.sessionId,
        ...(this.egress ? egressProxyEnv() : {}),
        ...(this.egress?.trustsCa ? trustedCaEnv() : {}),
      },
    })
    const terminal = pty ? { TERM: 'xterm-256color' } : {}
    return sandbox.exec({ command, env: { ...base, ...terminal, PWD: cwd, ...env }, cwd, pty })
  }

  /** Prepares the run directory and, for warm protocols, starts the sandbox. */
  async start(): Promise<void> {
    this.runDir.create()
    this.egress = await startAgentEgress(this.launch.egress, this.runDir, this.egressCa)
    if (this.protocol.warm) {
      const sandbox = await this.spawn(1)
      this.sandbox = sandbox
      this.protocol.listen(sandbox, this)
      sandbox.exited.then((exit) => {
        this.exitInfo = exit
      })
    }
  }

  /** The agent's whole environment for turn `turn`: the launch's, Cairn's, egress and protocol. */
  private environment(turn: number): Record<string, string> {
    return {
      ...this.launch.env,
      [AGENT_ENV.sessionId]: this.launch.sessionId,
      [AGENT_ENV.turn]: String(turn),
      [AGENT_ENV.transcriptPath]: '/run/cairn/transcript.jsonl',
      [AGENT_ENV.protocol]: this.launch.protocol,
      PYTHONUNBUFFERED: '1',
      ...(this.egress ? egressProxyEnv() : {}),
      ...(this.egress?.trustsCa ? trustedCaEnv() : {}),
      ...this.protocol.env(this.launch.env),
    }
  }

  /** The sandbox of turn `turn` (its environment), as container `id` with its run dir at `runDir`. */
  private sandboxSpec(id: string, runDir: string, turn: number): SandboxSpec {
    const transparent = this.driver.capabilities.transparentEgress
    return {
      id,
      workspaceDir: this.launch.workspaceDir,
      runDir,
      // With an allowlist, a forwarder on the sandbox's loopback relays to the egress proxy; where
      // the driver can, every TCP connection and DNS query of the sandbox is redirected to it too.
      command:
        this.egress && this.launch.egress
          ? forwarderCommand(this.launch.command, transparent, this.launch.egress.policy)
          : this.launch.command,
      ...(this.egress && transparent ? { network: 'egress' as const } : {}),
      env: this.environment(turn),
      limits: this.launch.limits,
      binds: this.launch.binds,
      home: this.launch.home,
      checkpointable: this.launch.checkpointable,
      rootfs: this.launch.rootfs,
      // A file on a tmpfs (its pages count in the agent's memory: `instanceStderrDir`), not a pipe
      // the server holds while the agent waits.
      stderrFile: this.runDir.stderrFile,
    }
  }

  /**
   * Boots, for this agent's next process restored from its checkpoint, the sandbox that restore
   * loads the image into (drivers with `prepareRestore`), its run dir made; the id returned goes in
   * that process's `AgentResume.targetId` (the run dir is the caller's to remove if none takes
   * it). Undefined where the driver boots at restore.
   */
  async prepareRestoreTarget(): Promise<{ sandboxId: string; runDir: string } | undefined> {
    if (!this.driver.prepareRestore || !this.protocol.warm || !this.launch.checkpointable) return undefined
    const id = newId('sandbox')
    const runDir = path.join(this.runRoot, id)
    await mkdir(runDir, { recursive: true, mode: 0o755 })
    try {
      await this.driver.prepareRestore(this.sandboxSpec(id, runDir, 1))
    } catch (error) {
      await rm(runDir, { recursive: true, force: true })
      throw error
    }
    return { sandboxId: id, runDir }
  }

  private async spawn(turn: number): Promise<Sandbox> {
    const resume = this.protocol.warm ? this.launch.resume : undefined
    const spec = this.sandboxSpec(
      this.protocol.warm ? this.sandboxId : newId('sandbox'),
      this.runDir.dir,
      turn,
    )
    // A memory checkpoint's sandbox goes on where it was instead of running the command.
    const sandbox =
      resume && this.driver.restore
        ? await this.driver.restore(spec, resume.imageDir)
        : await this.driver.start(spec)
    this.stderrTail.attach(sandbox)
    return sandbox
  }

  stderr(): string {
    return this.stderrTail.value()
  }

  /** Runs one turn; `gate`, when given, pauses the reading of the agent's answer while it is closed. */
  runTurn(
    input: TurnInput,
    onEvent: (event: AgentEvent) => void,
    signal?: AbortSignal,
    gate?: OutputGate,
  ): Promise<TurnOutcome> {
    // Checked and set synchronously: `active` is only set once the transcript is written.
    if (this.busy) return Promise.reject(new Error('a turn is already running on this agent process'))
    this.busy = true
    return this.turn(input, onEvent, signal, gate).finally(() => {
      this.busy = false
    })
  }

  private async turn(
    input: TurnInput,
    onEvent: (event: AgentEvent) => void,
    signal?: AbortSignal,
    gate?: OutputGate,
  ): Promise<TurnOutcome> {
    const warm = this.sandbox
    if (!this.alive || (this.protocol.warm && !warm)) throw new Error('agent process is not running')
    await this.runDir.writeTranscript(input.transcript, input.turn)
    this.stderrTail.mark()
    if (warm) return this.superviseTurn(warm, input, onEvent, signal, gate)
    // A sandbox for this turn alone.
    const sandbox = await this.spawn(input.turn)
    this.protocol.listen(sandbox, this)
    try {
      return await this.superviseTurn(sandbox, input, onEvent, signal, gate)
    } finally {
      await sandbox.destroy()
    }
  }

  /** Adds reply text; an agent that floods its output past the cap is stopped (`output_limit`). */
  appendText(turn: ActiveTurn, text: string): void {
    const cap = this.maxOutputChars
    if (turn.text.length + text.length > cap) {
      turn.fail({
        code: 'limit_exceeded',
        cause: 'output_limit',
        message: `the agent wrote more than ${cap} characters in one turn and was stopped`,
      })
      return
    }
    turn.text += text
    turn.onEvent({ type: 'text', content: text })
  }

  /**
   * Runs one turn to its end: the agent's marker or frame, its exit, a limit, the turn timeout or
   * the caller's abort — whichever comes first. A failed or cancelled turn settles only once its
   * sandbox is gone, so the caller never sees a turn over while its processes still run.
   */
  private superviseTurn(
    sandbox: Sandbox,
    input: TurnInput,
    onEvent: (event: AgentEvent) => void,
    signal: AbortSignal | undefined,
    gate: OutputGate | undefined,
  ): Promise<TurnOutcome> {
    const { warm } = this.protocol
    return new Promise<TurnOutcome>((resolve) => {
      let done = false
      const unwatch = gate?.watch((open) => this.protocol.throttle(sandbox, !open))
      const settle = (outcome: () => TurnOutcome, teardown: boolean) => {
        if (done) return
        done = true
        // Whatever the reader wants now, the agent's output is read again between turns.
        unwatch?.()
        this.protocol.throttle(sandbox, false)
        clearTimeout(timeout)
        clearInterval(limitPoll)
        signal?.removeEventListener('abort', onAbort)
        const end = () => {
          this.active = undefined
          resolve(outcome())
        }
        if (!teardown) return end()
        // The turn stays active until the sandbox is gone: what the agent wrote before it was
        // stopped is still in the pipes and belongs to this turn's partial reply.
        const stopping = warm ? this.stop() : sandbox.destroy()
        stopping.then(end, end)
      }
      const partial = () => turn.early + turn.text
      const turn: ActiveTurn = {
        text: '',
        early: '',
        onEvent,
        finish: (outcome) => settle(() => outcome, false),
        fail: (failure) =>
          settle(() => ({ status: 'failed', ...failure, text: partial(), stderr: this.stderr() }), true),
      }
      const failForLimit = (limit: 'memory' | 'pids' | undefined): boolean => {
        if (limit === 'memory') {
          turn.fail({
            code: 'limit_exceeded',
            cause: 'memory_limit',
            message: 'the agent ran out of memory and was stopped',
          })
        } else if (limit === 'pids') {
          turn.fail({
            code: 'limit_exceeded',
            cause: 'pids_limit',
            message: 'the agent hit its process limit and was stopped',
          })
        }
        return limit !== undefined
      }
      const onAbort = () =>
        settle(() => ({ status: 'cancelled', text: partial(), stderr: this.stderr() }), true)
      const limitPoll = setInterval(() => {
        if (!failForLimit(sandbox.limitHit())) this.stderrTail.trim()
      }, LIMIT_POLL_MS)
      const timeout = setTimeout(
        () =>
          turn.fail({
            code: 'timeout',
            cause: 'turn_timeout',
            message: `the turn ran past the agent's turn timeout (${this.launch.turnTimeoutMs / 1000} s, limits.turnTimeoutMs) and was stopped`,
          }),
        this.launch.turnTimeoutMs,
      )
      signal?.addEventListener('abort', onAbort, { once: true })
      this.active = turn
      sandbox.exited.then((exit) => {
        if (done) return
        if (failForLimit(exit.limit ?? sandbox.limitHit())) return
        // Output of an agent that exits without asking for more input (no shim, or a one-shot
        // program) is its reply, even when it came before the ask for this turn's line.
        if (turn.early) {
          turn.text = turn.early + turn.text
          onEvent({ type: 'text', content: turn.early })
          turn.early = ''
        }
        if (exit.code === 0 && this.protocol.exitCompletes) {
          if (warm) this.stopped = true
          return turn.finish({
            status: 'completed',
            text: turn.text,
            stderr: this.stderr(),
            agentExited: true,
          })
        }
        const how = exit.signal ? `was killed by ${exit.signal}` : `exited with code ${exit.code}`
        const last = lastErrorLine(this.stderr())
        turn.fail({
          code: 'agent_crashed',
          cause: 'agent_crash',
          message: `the agent ${how}${last ? `: ${last}` : ''}`,
        })
      })
      if (signal?.aborted) return onAbort()
      this.protocol.send(sandbox, input)
    })
  }

  async stop(): Promise<void> {
    this.stopped = true
    const sandbox = this.sandbox
    this.sandbox = undefined
    if (sandbox) await sandbox.destroy()
    // Stopping is best effort past the sandbox itself (gone above): a relay that never started, a
    // proxy already closed or run files already removed leave nothing running; each is logged.
    const leftover = (what: string) => (error: unknown) =>
      this.logger.warn({ err: error, sandboxId: this.sandboxId }, `stopping the agent: ${what} failed`)
    this.ports.stop(leftover('stopping the port relay'))
    await this.egress?.proxy.close().catch(leftover('closing the egress proxy'))
    this.egress = undefined
    // The last turn's stderr is read before its file goes (a failed turn's outcome is made after this).
    this.stderrTail.keep()
    await this.runDir.remove().catch(leftover('removing the run dir'))
  }
}

/**
 * The line of an agent's stderr that says what went wrong: the last one that is not a marker
 * (Python's `^^^^` and `~~~~` under the failing expression) nor blank — for a traceback, the
 * exception (`ZeroDivisionError: division by zero`). The whole stderr stays in the turn's log.
 */
export function lastErrorLine(stderr: string): string {
  const lines = stderr.split('\n').map((l) => l.trim())
  const meaningful = lines.filter((l) => l !== '' && !/^[\^~\s]+$/.test(l))
  return (meaningful.at(-1) ?? '').slice(0, 500)
}
