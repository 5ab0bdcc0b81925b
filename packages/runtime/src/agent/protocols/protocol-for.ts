import type net from 'node:net'
import { CairnProblem } from '@cairn/protocol'
import type { AgentLaunch, ProtocolState } from '../types.js'
import type { AgentProtocol } from './agent-protocol.js'
import { ExecProtocol } from './exec-protocol.js'
import { HttpProtocol } from './http-protocol.js'
import { JsonlProtocol } from './jsonl-protocol.js'
import { StdioProtocol } from './stdio-protocol.js'

/**
 * The protocol object for a launch's `protocol`; an http agent is reached through `connect`;
 * `state` from `AgentProtocol.state` to go on after a checkpoint.
 */
export function protocolFor(
  launch: AgentLaunch,
  connect: (port: number) => Promise<net.Socket>,
  state?: ProtocolState,
): AgentProtocol {
  switch (launch.protocol) {
    case 'stdio':
      return new StdioProtocol(state)
    case 'jsonl':
      return new JsonlProtocol()
    case 'exec':
      return new ExecProtocol()
    case 'http':
      if (!launch.http) throw new CairnProblem('invalid_manifest', 'protocol http needs http.port')
      return new HttpProtocol(launch.http, launch.sessionId, connect)
  }
}
