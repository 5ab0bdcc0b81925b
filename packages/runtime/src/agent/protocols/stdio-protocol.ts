import { randomBytes } from 'node:crypto'
import { StringDecoder } from 'node:string_decoder'
import { AGENT_ENV } from '@cairn/protocol'
import { joinSearchPath } from '../../launch/launch-env.js'
import type { Sandbox } from '../../sandbox/driver.js'
import type { ActiveTurn, TurnChannel } from '../active-turn.js'
import { StdioMarkerParser } from '../stdio-marker.js'
import type { TurnInput } from '../types.js'
import type { AgentProtocol, ProtocolState } from './agent-protocol.js'
import { throttleStdout } from './throttle.js'

/**
 * stdio: a warm agent reading one message per line. The shims mark each read of stdin with a
 * nonce and the number of lines read so far; the mark of the read after this turn's line ends it.
 */
export class StdioProtocol implements AgentProtocol {
  readonly name = 'stdio' as const
  readonly warm = true
  readonly throttle = throttleStdout
  readonly exitCompletes = true
  private readonly nonce: string
  private linesSent = 0
  /** The running turn's line is the agent's `expectLines`-th; its marker with that count ends it. */
  private expectLines = 1
  /**
   * Lines the agent had read when it last asked for input (-1 before its first ask). Output after
   * the ask for line N and before the ask for line N+1 is the reply to line N+1.
   */
  private asked = -1

  /** `state`: what `state()` returned in the process that checkpointed this agent. */
  constructor(state?: ProtocolState) {
    const { nonce, linesSent, asked } = state ?? {}
    this.nonce = typeof nonce === 'string' ? nonce : randomBytes(8).toString('hex')
    if (typeof linesSent === 'number') this.linesSent = linesSent
    if (typeof asked === 'number') this.asked = asked
  }

  state(): ProtocolState {
    return { nonce: this.nonce, linesSent: this.linesSent, asked: this.asked }
  }

  env(base: Readonly<Record<string, string>>): Record<string, string> {
    return {
      [AGENT_ENV.stdioMark]: this.nonce,
      PYTHONPATH: joinSearchPath('/opt/cairn/shims/python', base.PYTHONPATH),
      NODE_OPTIONS: '--require=/opt/cairn/shims/node/stdio.cjs',
      BASH_ENV: '/opt/cairn/shims/bash/stdio.sh',
    }
  }

  listen(sandbox: Sandbox, channel: TurnChannel): void {
    const decoder = new StringDecoder('utf8')
    const parser = new StdioMarkerParser(this.nonce)
    sandbox.stdout.on('data', (chunk: Buffer) => {
      for (const piece of parser.push(decoder.write(chunk))) {
        const turn = channel.active
        if (turn && piece.text) {
          // A piece's text was printed before its marker, so it is judged by the asks seen so far.
          if (this.asked >= this.expectLines - 1) channel.appendText(turn, piece.text)
          else appendEarly(channel, turn, piece.text)
        }
        if (piece.marker === undefined) continue
        this.asked = Math.max(this.asked, piece.marker)
        if (!turn) continue // output between turns is not a reply
        // The ask for this turn's line: what came before it (a banner) is not the reply.
        if (piece.marker === this.expectLines - 1) turn.early = ''
        if (piece.marker >= this.expectLines) {
          turn.finish({ status: 'completed', text: turn.text, stderr: channel.stderr(), agentExited: false })
        }
      }
    })
  }

  send(sandbox: Sandbox, input: TurnInput): void {
    this.linesSent++
    this.expectLines = this.linesSent
    // stdio carries one message per line; newlines inside a prompt become spaces.
    sandbox.stdin.write(`${input.prompt.replace(/\r?\n/g, ' ')}\n`)
  }
}

/**
 * Output before the agent read this turn's line (a banner, unless it exits): held back, and capped
 * like the reply (it makes no events, so nothing else stops the reading of an agent that prints
 * without ever reading its line).
 */
function appendEarly(channel: TurnChannel, turn: ActiveTurn, text: string): void {
  const cap = channel.maxOutputChars
  if (turn.early.length + text.length > cap) {
    turn.fail({
      code: 'limit_exceeded',
      cause: 'output_limit',
      message: `the agent wrote more than ${cap} characters before it read its line and was stopped`,
    })
    return
  }
  turn.early += text
}
