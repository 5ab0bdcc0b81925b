import type { IncomingMessage } from 'node:http'
import type net from 'node:net'
import type { HttpAgent } from '@cairn/protocol'
import type { Sandbox } from '../../sandbox/driver.js'
import type { TurnChannel } from '../active-turn.js'
import type { TurnInput } from '../types.js'
import type { AgentProtocol } from './agent-protocol.js'
import { sendHttpTurn } from './http-transport.js'
import { handleFrame } from './jsonl-protocol.js'
import { kitLibraryEnv } from './kit-env.js'

/**
 * http: a warm agent serving HTTP on its port inside the sandbox; each message is a request to it
 * (http-transport.ts), whose answer streams into the turn. What the agent prints is its log: stdout
 * is drained, stderr kept for crash messages as for every protocol.
 */
export class HttpProtocol implements AgentProtocol {
  readonly name = 'http' as const
  readonly warm = true
  readonly exitCompletes = false
  private channel: TurnChannel | undefined
  /** The running turn's answer, and whether its reader asked to stop reading it. */
  private answer: IncomingMessage | undefined
  private paused = false

  constructor(
    private readonly config: HttpAgent,
    private readonly sessionId: string,
    /** A socket to a port on the sandbox's loopback (the agent's port relay). */
    private readonly connect: (port: number) => Promise<net.Socket>,
  ) {}

  /** The kit's libraries, and `PORT` (the port to serve on) unless the agent's own environment sets one. */
  env(base: Readonly<Record<string, string>>): Record<string, string> {
    return { ...kitLibraryEnv(base), ...(base.PORT === undefined ? { PORT: String(this.config.port) } : {}) }
  }

  listen(sandbox: Sandbox, channel: TurnChannel): void {
    this.channel = channel
    sandbox.stdout.resume()
  }

  throttle(_sandbox: Sandbox, paused: boolean): void {
    this.paused = paused
    if (paused) this.answer?.pause()
    else this.answer?.resume()
  }

  send(_sandbox: Sandbox, input: TurnInput): void {
    const channel = this.channel
    const turn = channel?.active
    if (!channel || !turn) return
    const message = {
      prompt: input.prompt,
      sessionId: this.sessionId,
      turn: input.turn,
      turnId: input.turnId,
      ...(input.approval ? { approval: input.approval } : {}),
    }
    void sendHttpTurn(
      this.connect,
      this.config,
      message,
      {
        text: (chunk) => channel.appendText(turn, chunk),
        frame: (json) => handleFrame(channel, json),
        end: (failure) =>
          turn.finish(
            failure
              ? { status: 'failed', ...failure, text: turn.text, stderr: channel.stderr() }
              : { status: 'completed', text: turn.text, stderr: channel.stderr(), agentExited: false },
          ),
        fail: (failure) => turn.fail(failure),
        running: () => channel.active === turn,
        answering: (answer) => {
          this.answer = answer
          answer.once('close', () => {
            if (this.answer === answer) this.answer = undefined
          })
          if (this.paused) answer.pause()
        },
      },
      channel.maxOutputChars,
    )
  }
}
