import type { Sandbox } from '../../sandbox/driver.js'
import type { TurnChannel } from '../active-turn.js'
import type { AgentLaunch, ProtocolState, TurnInput } from '../types.js'

export type { ProtocolState } from '../types.js'

/**
 * How the runtime talks to one kind of agent: what it adds to the environment, how a prompt
 * reaches the agent, and how its output becomes the turn's events and end. One instance per agent
 * process (a protocol may keep state across turns, as stdio's line count).
 */
export interface AgentProtocol {
  readonly name: AgentLaunch['protocol']
  /** One sandbox kept warm for the agent's life (stdio, jsonl) or one sandbox per turn (exec). */
  readonly warm: boolean
  /** Whether the agent exiting with code 0 completes the turn (it replied and left). */
  readonly exitCompletes: boolean
  /** Variables the protocol adds to the agent's environment (`base` is the launch's). */
  env(base: Readonly<Record<string, string>>): Record<string, string>
  /** Routes the sandbox's stdout to the running turn (for a warm sandbox, for its whole life). */
  listen(sandbox: Sandbox, channel: TurnChannel): void
  /** Hands the turn's prompt to the agent; called with the turn already active. */
  send(sandbox: Sandbox, input: TurnInput): void
  /**
   * Stops reading the agent's answer (`paused`: its reader is behind; the agent's writes block
   * once the pipe or socket is full) or reads it again.
   */
  throttle(sandbox: Sandbox, paused: boolean): void
  /**
   * What the protocol knows of the running agent that the next process must know to go on talking
   * to it after a memory checkpoint (stdio: its nonce and line counts); given back to `protocolFor`.
   */
  state?(): ProtocolState
}
