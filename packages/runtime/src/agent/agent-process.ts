import { randomBytes } from 'node:crypto'
import {
  chmodSync,
  closeSync,
  constants as fsConstants,
  ftruncateSync,
  mkdirSync,
  openSync,
  writeSync,
} from 'node:fs'
import { readFile, rename, rm, writeFile } from 'node:fs/promises'
import type net from 'node:net'
import path from 'node:path'
import { StringDecoder } from 'node:string_decoder'
import { AGENT_ENV, CairnProblem, newId, OutboundFrameSchema, type TranscriptLine } from '@cairn/protocol'
import { Value } from '@sinclair/typebox/value'
import type { EgressCa } from '../egress/egress-ca.js'
import { EgressProxy } from '../egress/proxy.js'
import { FORWARDER_PORTS, forwarderCommand } from '../egress/transparent.js'
import { listeningPorts } from '../ports/listening-ports.js'
import { PortRelay } from '../ports/port-relay.js'
import { requireCapability } from '../sandbox/capabilities.js'
import type { Sandbox, SandboxDriver, SandboxExit, SandboxSpec } from '../sandbox/driver.js'
import { type Logger, noopLogger } from '../util/logger.js'
import { TailBuffer } from '../util/tail.js'
import { StdioMarkerParser } from './stdio-marker.js'
import {
  type AgentEvent,
  type AgentLaunch,
  type AgentMemoryState,
  DEFAULT_MAX_OUTPUT_CHARS,
  type TurnInput,
  type TurnOutcome,
} from './types.js'

const LIMIT_POLL_MS = 200
/** Debian's and Ubuntu's bundle of the system's trusted CAs. */
const SYSTEM_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt'

type Failure = Omit<Extract<TurnOutcome, { status: 'failed' }>, 'status' | 'text' | 'stderr'>

interface ActiveTurn {
  /** stdio: the turn's line is the agent's `expectLines`-th; its marker with that count ends it. */
  expectLines: number
  text: string
  /** stdio: output seen before the agent asked for this turn's line (a banner, unless it exits). */
  early: string
  onEvent: (event: AgentEvent) => void
  finish: (outcome: TurnOutcome) => void
  fail: (failure: Failure) => void
}

/**
 * One agent process in one sandbox, kept warm between turns (stdio and jsonl), or one sandbox per
 * turn (exec). Turns run one at a time; the caller (the session service) enforces that too.
 */
export class AgentProcess {
  readonly sandboxId = newId('sandbox')
  private sandbox: Sandbox | undefined
  private readonly stderr = new TailBuffer(16_384)
  private readonly nonce: string
  private linesSent = 0
  private active: ActiveTurn | undefined
  private exitInfo: SandboxExit | undefined
  private stopped = false
  private busy = false
  readonly startedAt = Date.now()
  private readonly runDir: string

  constructor(
    private readonly driver: SandboxDriver,
    private readonly launch: AgentLaunch,
    runRoot: string,
    /** The per-install CA, loaded when an agent first needs TLS terminated for a proxy secret. */
    private readonly egressCa?: () => Promise<EgressCa>,
    private readonly logger: Logger = noopLogger,
  ) {
    this.runDir = path.join(runRoot, this.sandboxId)
    const resumed = launch.resume?.state
    this.nonce = resumed?.nonce ?? randomBytes(8).toString('hex')
    if (resumed) {
      this.linesSent = resumed.linesSent
      this.asked = resumed.asked
    }
  }

  /**
   * Writes the warm sandbox's processes and memory to `imageDir` and stops it; the state returned
   * goes with the image into `AgentLaunch.resume`. Refused with a typed error by a driver without
   * `memorySnapshot`, for an exec agent (no process between turns) and during a turn.
   */
  async checkpoint(imageDir: string): Promise<{ state: AgentMemoryState; bytes: number }> {
    requireCapability(this.driver, 'memorySnapshot', 'checkpoint a sandbox with its memory')
    const sandbox = this.sandbox
    if (this.launch.protocol === 'exec' || !sandbox || !this.alive || !this.driver.checkpoint)
      throw new CairnProblem('sandbox_not_running', 'the agent has no running sandbox to checkpoint')
    if (this.busy) throw new CairnProblem('session_busy', 'the agent is running a turn')
    const state = { nonce: this.nonce, linesSent: this.linesSent, asked: this.asked }
    this.busy = true
    try {
      const { bytes } = await this.driver.checkpoint(sandbox, imageDir)
      return { state, bytes }
    } finally {
      this.busy = false
      await this.stop()
    }
  }

  get alive(): boolean {
    if (this.launch.protocol === 'exec') return !this.stopped
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
    if (this.launch.protocol === 'exec' || !this.alive) return undefined
    return this.sandbox?.writtenBytes?.()
  }

  get pid(): number | undefined {
    return this.sandbox?.pid
  }

  private relay: Promise<PortRelay> | undefined

  private async networkNamespace(): Promise<string> {
    requireCapability(this.driver, 'ports', 'reach a port inside the sandbox')
    const namespace = this.alive ? await this.sandbox?.networkNamespace?.() : undefined
    if (!namespace) {
      throw new CairnProblem(
        'sandbox_not_running',
        'the session has no running sandbox; send a message to start it',
      )
    }
    return namespace
  }

  /** A socket to 127.0.0.1:`port` inside the sandbox, through a relay started on first use. */
  async connectPort(port: number): Promise<net.Socket> {
    // A preview of the forwarder would lend the caller the session's egress (and proxy secrets).
    if (this.proxy && FORWARDER_PORTS.has(port))
      throw new CairnProblem(
        'forbidden',
        `port ${port} is Cairn's egress forwarder inside the sandbox, not a service of the session`,
      )
    const namespace = await this.networkNamespace()
    const socketPath = path.join(this.runDir, 'ports.sock')
    // Shared by concurrent first requests; restarted should the relay have died.
    this.relay ??= PortRelay.start(namespace, socketPath)
    // A relay that failed to start is started again below (a second failure is the caller's).
    let relay = await this.relay.catch((error: unknown) => {
      this.logger.warn({ err: error, sandboxId: this.sandboxId }, 'the port relay failed to start; retrying')
      return undefined
    })
    if (!relay?.alive) {
      this.relay = PortRelay.start(namespace, socketPath)
      relay = await this.relay
    }
    if (this.stopped) relay.stop()
    return relay.connect(port)
  }

  /** TCP ports a service listens on inside the sandbox (empty without a running sandbox). */
  async listeningPorts(): Promise<number[]> {
    if (!this.driver.capabilities.ports || !this.alive) return []
    const namespace = await this.sandbox?.networkNamespace?.()
    const pid = namespace ? Number(namespace.split('/')[2]) : undefined
    const ports = pid ? await listeningPorts(pid) : []
    return this.proxy ? ports.filter((port) => !FORWARDER_PORTS.has(port)) : ports
  }

  /** Prepares the run directory and, for warm protocols, starts the sandbox. */
  async start(): Promise<void> {
    // Synchronous: three metadata operations take microseconds, a thread-pool trip each takes more.
    mkdirSync(this.runDir, { recursive: true })
    chmodSync(this.runDir, 0o755)
    const { O_WRONLY, O_CREAT, O_TRUNC, O_APPEND } = fsConstants
    this.transcriptFd = openSync(
      path.join(this.runDir, 'transcript.jsonl'),
      O_WRONLY | O_CREAT | O_TRUNC | O_APPEND,
      0o644,
    )
    const egress = this.launch.egress
    if (egress && egress.policy.allow.length > 0) {
      const secrets = egress.secrets ?? []
      const ca = secrets.length > 0 && this.egressCa ? await this.egressCa() : undefined
      if (ca) await this.writeTrustedCa(ca)
      this.proxy = new EgressProxy({
        ...egress,
        socketPath: path.join(this.runDir, 'egress.sock'),
        secrets,
        ca,
      })
      await this.proxy.listen()
    }
    if (this.launch.protocol !== 'exec') {
      this.sandbox = await this.spawn(1)
      this.listen(this.sandbox)
    }
  }

  private proxy: EgressProxy | undefined
  /** Set once the sandbox must trust the egress CA (TLS is terminated for a proxy secret). */
  private trustsEgressCa = false

  /**
   * The egress CA where the sandbox reads it (/run/cairn): alone for Node's NODE_EXTRA_CA_CERTS, and
   * appended to the system bundle for OpenSSL-based clients, whose variables replace that bundle.
   */
  private async writeTrustedCa(ca: EgressCa): Promise<void> {
    let system = ''
    try {
      system = await readFile(SYSTEM_CA_BUNDLE, 'utf8')
    } catch {}
    await writeFile(path.join(this.runDir, 'egress-ca.pem'), ca.certificatePem, { mode: 0o644 })
    const bundle = `${system}${system.endsWith('\n') || !system ? '' : '\n'}${ca.certificatePem}`
    await writeFile(path.join(this.runDir, 'ca-bundle.pem'), bundle, { mode: 0o644 })
    this.trustsEgressCa = true
  }

  private get transparentEgress(): boolean {
    return this.driver.capabilities.transparentEgress
  }

  private async spawn(turn: number): Promise<Sandbox> {
    const env: Record<string, string> = {
      ...this.launch.env,
      [AGENT_ENV.sessionId]: this.launch.sessionId,
      [AGENT_ENV.turn]: String(turn),
      [AGENT_ENV.transcriptPath]: '/run/cairn/transcript.jsonl',
      [AGENT_ENV.protocol]: this.launch.protocol,
    }
    // Kit paths come first; paths the launch brings (a dependency environment) follow them.
    const joinPath = (kit: string, extra: string | undefined) => (extra ? `${kit}:${extra}` : kit)
    env.PYTHONUNBUFFERED = '1'
    if (this.launch.egress && this.launch.egress.policy.allow.length > 0) {
      for (const name of ['HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy'])
        env[name] = 'http://127.0.0.1:3128'
      env.NO_PROXY = 'localhost,127.0.0.1,::1'
      env.no_proxy = env.NO_PROXY
    }
    if (this.trustsEgressCa) {
      for (const name of ['SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE'])
        env[name] = '/run/cairn/ca-bundle.pem'
      env.NODE_EXTRA_CA_CERTS = '/run/cairn/egress-ca.pem'
    }
    if (this.launch.protocol === 'stdio') {
      env[AGENT_ENV.stdioMark] = this.nonce
      env.PYTHONPATH = joinPath('/opt/cairn/shims/python', this.launch.env.PYTHONPATH)
      env.NODE_OPTIONS = '--require=/opt/cairn/shims/node/stdio.cjs'
      env.BASH_ENV = '/opt/cairn/shims/bash/stdio.sh'
    } else {
      env.PYTHONPATH = joinPath('/opt/cairn/python', this.launch.env.PYTHONPATH)
      env.NODE_PATH = joinPath('/opt/cairn/node', this.launch.env.NODE_PATH)
    }
    const resume = this.launch.protocol === 'exec' ? undefined : this.launch.resume
    const sandboxSpec: SandboxSpec = {
      id: this.launch.protocol === 'exec' ? newId('sandbox') : this.sandboxId,
      workspaceDir: this.launch.workspaceDir,
      runDir: this.runDir,
      // With an allowlist, a forwarder on the sandbox's loopback relays to the egress proxy; where
      // the driver can, every TCP connection and DNS query of the sandbox is redirected to it too.
      command:
        this.proxy && this.launch.egress
          ? forwarderCommand(this.launch.command, this.transparentEgress, this.launch.egress.policy)
          : this.launch.command,
      ...(this.proxy && this.transparentEgress ? { network: 'egress' as const } : {}),
      env,
      limits: this.launch.limits,
      binds: this.launch.binds,
    }
    const sandbox =
      resume && this.driver.restore
        ? await this.driver.restore(sandboxSpec, resume.imageDir)
        : await this.driver.start(sandboxSpec)
    const stderrDecoder = new StringDecoder('utf8')
    sandbox.stderr.on('data', (chunk: Buffer) => this.stderr.push(stderrDecoder.write(chunk)))
    return sandbox
  }

  /** Lines of the transcript already in the file: each turn appends only what is new. */
  private transcriptWritten = 0
  /**
   * The run dir's transcript (appended to) and `turn` file (overwritten in place), open for the
   * life of the process: an open and a close per file per turn cost more than the write, and
   * truncating a non-empty file makes ext4 (a disk-backed /run) flush it on close.
   */
  private transcriptFd: number | undefined
  private turnFd: number | undefined
  private turnFileLength = 0

  private async writeTranscript(transcript: readonly TranscriptLine[], turn: number): Promise<void> {
    const file = path.join(this.runDir, 'transcript.jsonl')
    const fresh = transcript.slice(this.transcriptWritten)
    if (transcript.length < this.transcriptWritten) {
      // The history got shorter than what was written (not expected): rewrite it whole.
      const body = transcript.map((line) => `${JSON.stringify(line)}\n`).join('')
      const tmp = path.join(this.runDir, `.transcript.${turn}.tmp`)
      await writeFile(tmp, body, { mode: 0o644 })
      await rename(tmp, file)
      this.closeRunFiles()
    } else if (fresh.length > 0) {
      // Small synchronous writes: cheaper than two trips through the thread pool on the warm path.
      this.transcriptFd ??= openSync(file, 'a', 0o644)
      writeSync(this.transcriptFd, fresh.map((line) => `${JSON.stringify(line)}\n`).join(''))
    }
    this.transcriptWritten = transcript.length
    const text = `${turn}\n`
    this.turnFd ??= openSync(path.join(this.runDir, 'turn'), 'w', 0o644)
    writeSync(this.turnFd, text, 0)
    // Turn numbers grow, so this shortens the file only if one ever went back.
    if (text.length < this.turnFileLength) ftruncateSync(this.turnFd, text.length)
    this.turnFileLength = text.length
  }

  private closeRunFiles(): void {
    for (const fd of [this.transcriptFd, this.turnFd]) if (fd !== undefined) closeSync(fd)
    this.transcriptFd = undefined
    this.turnFd = undefined
    this.turnFileLength = 0
  }

  runTurn(
    input: TurnInput,
    onEvent: (event: AgentEvent) => void,
    signal?: AbortSignal,
  ): Promise<TurnOutcome> {
    // Checked and set synchronously: `active` is only set once the transcript is written.
    if (this.busy) return Promise.reject(new Error('a turn is already running on this agent process'))
    this.busy = true
    const run =
      this.launch.protocol === 'exec'
        ? this.runExecTurn(input, onEvent, signal)
        : this.runWarmTurn(input, onEvent, signal)
    return run.finally(() => {
      this.busy = false
    })
  }

  private async runWarmTurn(
    input: TurnInput,
    onEvent: (event: AgentEvent) => void,
    signal?: AbortSignal,
  ): Promise<TurnOutcome> {
    const sandbox = this.sandbox
    if (!sandbox || !this.alive) throw new Error('agent process is not running')
    await this.writeTranscript(input.transcript, input.turn)
    this.stderr.clear()
    return this.superviseTurn(sandbox, onEvent, signal, () => {
      this.linesSent++
      if (this.launch.protocol === 'stdio') {
        // stdio carries one message per line; newlines inside a prompt become spaces.
        sandbox.stdin.write(`${input.prompt.replace(/\r?\n/g, ' ')}\n`)
      } else {
        sandbox.stdin.write(
          `${JSON.stringify({ type: 'message', content: input.prompt, turn: input.turn, turnId: input.turnId })}\n`,
        )
      }
    })
  }

  /**
   * Lines the stdio agent had read when it last asked for input (-1 before its first ask). Output
   * after the ask for line N and before the ask for line N+1 is the reply to line N+1.
   */
  private asked = -1

  /** Routes stdout to the running turn for the lifetime of a warm sandbox. */
  private listen(sandbox: Sandbox): void {
    const decoder = new StringDecoder('utf8')
    if (this.launch.protocol === 'stdio') {
      const parser = new StdioMarkerParser(this.nonce)
      sandbox.stdout.on('data', (chunk: Buffer) => {
        for (const piece of parser.push(decoder.write(chunk))) {
          const turn = this.active
          if (turn && piece.text) {
            // A piece's text was printed before its marker, so it is judged by the asks seen so far.
            if (this.asked >= turn.expectLines - 1) {
              this.appendText(turn, piece.text)
            } else {
              turn.early += piece.text
            }
          }
          if (piece.marker === undefined) continue
          this.asked = Math.max(this.asked, piece.marker)
          if (!turn) continue // output between turns is not a reply
          // The ask for this turn's line: what came before it (a banner) is not the reply.
          if (piece.marker === turn.expectLines - 1) turn.early = ''
          if (piece.marker >= turn.expectLines) {
            turn.finish({
              status: 'completed',
              text: turn.text,
              stderr: this.stderr.value(),
              agentExited: false,
            })
          }
        }
      })
    } else {
      let pending = ''
      sandbox.stdout.on('data', (chunk: Buffer) => {
        pending += decoder.write(chunk)
        let newline = pending.indexOf('\n')
        while (newline >= 0) {
          const line = pending.slice(0, newline).trim()
          pending = pending.slice(newline + 1)
          if (line) this.handleFrame(line)
          newline = pending.indexOf('\n')
        }
        const cap = this.launch.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS
        if (pending.length > cap) {
          pending = ''
          this.active?.fail({
            code: 'limit_exceeded',
            cause: 'output_limit',
            message: `the agent wrote a frame longer than ${cap} characters and was stopped`,
          })
        }
      })
    }
    sandbox.exited.then((exit) => {
      this.exitInfo = exit
    })
  }

  /** Adds reply text; an agent that floods its output past the cap is stopped (`output_limit`). */
  private appendText(turn: ActiveTurn, text: string): void {
    const cap = this.launch.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS
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

  private handleFrame(line: string): void {
    const turn = this.active
    if (!turn) return
    let frame: unknown
    try {
      frame = JSON.parse(line)
    } catch {
      frame = undefined
    }
    if (!Value.Check(OutboundFrameSchema, frame)) {
      // The agent and the runtime no longer agree on where a turn ends: the process goes.
      turn.fail({
        code: 'agent_protocol_error',
        cause: 'protocol_error',
        message: `agent wrote an invalid jsonl frame: ${line.slice(0, 200)}`,
      })
      return
    }
    switch (frame.type) {
      case 'text':
        this.appendText(turn, frame.content)
        break
      case 'status':
        turn.onEvent({ type: 'status', message: frame.message })
        break
      case 'tool.start':
        turn.onEvent({ type: 'tool.start', id: frame.id, name: frame.name, input: frame.input })
        break
      case 'tool.end':
        turn.onEvent({
          type: 'tool.end',
          id: frame.id,
          output: frame.output,
          ...(frame.isError === undefined ? {} : { isError: frame.isError }),
        })
        break
      case 'metadata':
        turn.onEvent({ type: 'metadata', data: frame.data })
        break
      case 'turn.done':
        turn.finish({ status: 'completed', text: turn.text, stderr: this.stderr.value(), agentExited: false })
        break
      case 'error':
        turn.finish({
          status: 'failed',
          code: 'agent_crashed',
          cause: 'turn_failed',
          message: frame.message,
          text: turn.text,
          stderr: this.stderr.value(),
        })
        break
      case 'ready':
        break
    }
  }

  /**
   * Runs one turn to its end: the agent's marker or frame, its exit, a limit, the turn timeout or
   * the caller's abort — whichever comes first. A failed or cancelled turn settles only once its
   * sandbox is gone, so the caller never sees a turn over while its processes still run.
   */
  private superviseTurn(
    sandbox: Sandbox,
    onEvent: (event: AgentEvent) => void,
    signal: AbortSignal | undefined,
    send: () => void,
  ): Promise<TurnOutcome> {
    const exec = this.launch.protocol === 'exec'
    return new Promise<TurnOutcome>((resolve) => {
      let done = false
      const settle = (outcome: () => TurnOutcome, teardown: boolean) => {
        if (done) return
        done = true
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
        const stopping = exec ? sandbox.destroy() : this.stop()
        stopping.then(end, end)
      }
      const partial = () => turn.early + turn.text
      const turn: ActiveTurn = {
        expectLines: this.linesSent + 1,
        text: '',
        early: '',
        onEvent,
        finish: (outcome) => settle(() => outcome, false),
        fail: (failure) =>
          settle(
            () => ({ status: 'failed', ...failure, text: partial(), stderr: this.stderr.value() }),
            true,
          ),
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
        settle(() => ({ status: 'cancelled', text: partial(), stderr: this.stderr.value() }), true)
      const limitPoll = setInterval(() => failForLimit(sandbox.limitHit()), LIMIT_POLL_MS)
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
        if (exit.code === 0 && (exec || this.launch.protocol === 'stdio')) {
          if (!exec) this.stopped = true
          return turn.finish({
            status: 'completed',
            text: turn.text,
            stderr: this.stderr.value(),
            agentExited: true,
          })
        }
        const how = exit.signal ? `was killed by ${exit.signal}` : `exited with code ${exit.code}`
        const last = lastErrorLine(this.stderr.value())
        turn.fail({
          code: 'agent_crashed',
          cause: 'agent_crash',
          message: `the agent ${how}${last ? `: ${last}` : ''}`,
        })
      })
      if (signal?.aborted) return onAbort()
      send()
    })
  }

  private async runExecTurn(
    input: TurnInput,
    onEvent: (event: AgentEvent) => void,
    signal?: AbortSignal,
  ): Promise<TurnOutcome> {
    if (this.stopped) throw new Error('agent process is not running')
    await this.writeTranscript(input.transcript, input.turn)
    this.stderr.clear()
    const sandbox = await this.spawn(input.turn)
    const decoder = new StringDecoder('utf8')
    sandbox.stdout.on('data', (chunk: Buffer) => {
      const turn = this.active
      const text = decoder.write(chunk)
      if (!turn || !text) return
      this.appendText(turn, text)
    })
    try {
      return await this.superviseTurn(sandbox, onEvent, signal, () => {
        sandbox.stdin.end(input.prompt)
      })
    } finally {
      await sandbox.destroy()
    }
  }

  async stop(): Promise<void> {
    this.stopped = true
    const sandbox = this.sandbox
    this.sandbox = undefined
    if (sandbox) await sandbox.destroy()
    const relay = this.relay
    this.relay = undefined
    // Stopping is best effort past the sandbox itself (gone above): a relay that never started, a
    // proxy already closed or run files already removed leave nothing running; each is logged.
    const leftover = (what: string) => (error: unknown) =>
      this.logger.warn({ err: error, sandboxId: this.sandboxId }, `stopping the agent: ${what} failed`)
    relay?.then((r) => r.stop()).catch(leftover('stopping the port relay'))
    await this.proxy?.close().catch(leftover('closing the egress proxy'))
    this.proxy = undefined
    this.closeRunFiles()
    await rm(this.runDir, { recursive: true, force: true }).catch(leftover('removing the run dir'))
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
