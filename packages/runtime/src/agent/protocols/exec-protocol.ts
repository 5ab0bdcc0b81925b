import { StringDecoder } from 'node:string_decoder'
import type { Sandbox } from '../../sandbox/driver.js'
import type { TurnChannel } from '../active-turn.js'
import type { TurnInput } from '../types.js'
import type { AgentProtocol } from './agent-protocol.js'
import { kitLibraryEnv } from './kit-env.js'
import { throttleStdout } from './throttle.js'

/** exec: a sandbox per turn; the prompt is its stdin, everything on stdout is the reply. */
export class ExecProtocol implements AgentProtocol {
  readonly name = 'exec' as const
  readonly warm = false
  readonly throttle = throttleStdout
  readonly exitCompletes = true

  /** The kit's libraries ahead of the launch's search paths. */
  readonly env = kitLibraryEnv

  listen(sandbox: Sandbox, channel: TurnChannel): void {
    const decoder = new StringDecoder('utf8')
    sandbox.stdout.on('data', (chunk: Buffer) => {
      const turn = channel.active
      const text = decoder.write(chunk)
      if (!turn || !text) return
      channel.appendText(turn, text)
    })
  }

  send(sandbox: Sandbox, input: TurnInput): void {
    sandbox.stdin.end(input.prompt)
  }
}
