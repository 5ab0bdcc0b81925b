import { StringDecoder } from 'node:string_decoder'
import { OutboundFrameSchema } from '@cairn/protocol'
import { Value } from '@sinclair/typebox/value'
import type { Sandbox } from '../../sandbox/driver.js'
import type { TurnChannel } from '../active-turn.js'
import type { TurnInput } from '../types.js'
import type { AgentProtocol } from './agent-protocol.js'
import { kitLibraryEnv } from './kit-env.js'
import { LineSplitter } from './line-splitter.js'
import { throttleStdout } from './throttle.js'

/** jsonl: a warm agent reading one message frame per line and writing typed frames back. */
export class JsonlProtocol implements AgentProtocol {
  readonly name = 'jsonl' as const
  readonly warm = true
  readonly throttle = throttleStdout
  readonly exitCompletes = false

  /** The kit's libraries ahead of the launch's search paths. */
  readonly env = kitLibraryEnv

  listen(sandbox: Sandbox, channel: TurnChannel): void {
    const decoder = new StringDecoder('utf8')
    const lines = new LineSplitter()
    sandbox.stdout.on('data', (chunk: Buffer) => {
      for (const line of lines.push(decoder.write(chunk))) {
        const frame = line.trim()
        if (frame) handleFrame(channel, frame)
      }
      const cap = channel.maxOutputChars
      if (lines.pendingChars > cap) {
        lines.rest()
        channel.active?.fail({
          code: 'limit_exceeded',
          cause: 'output_limit',
          message: `the agent wrote a frame longer than ${cap} characters and was stopped`,
        })
      }
    })
  }

  send(sandbox: Sandbox, input: TurnInput): void {
    const { prompt: content, turn, turnId, approval } = input
    sandbox.stdin.write(
      `${JSON.stringify({ type: 'message', content, turn, turnId, ...(approval ? { approval } : {}) })}\n`,
    )
  }
}

/** One frame of the agent's (a jsonl line, or an http agent's SSE or ndjson answer) into the turn. */
export function handleFrame(channel: TurnChannel, line: string): void {
  const turn = channel.active
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
      channel.appendText(turn, frame.content)
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
    case 'approval.request':
      turn.onEvent({ type: 'approval.request', summary: frame.summary, action: frame.action })
      break
    case 'turn.done':
      turn.finish({ status: 'completed', text: turn.text, stderr: channel.stderr(), agentExited: false })
      break
    case 'error':
      turn.finish({
        status: 'failed',
        code: 'agent_crashed',
        cause: 'turn_failed',
        message: frame.message,
        text: turn.text,
        stderr: channel.stderr(),
      })
      break
    case 'ready':
      break
  }
}
