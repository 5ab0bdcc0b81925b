import type { NodeAction, NodeInfo, NodeState, SessionMove } from '@cairn/protocol'
import { checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import * as valid from './validators.js'

export type { NodeAction, NodeState, SessionMove }

/** A runtime node of the cluster (`cairn node`), as the database says. */
export interface NodeSummary {
  /** The node's runtime ID (`rt_…`). */
  id: string
  name: string
  address: string
  bootId: string
  state: NodeState
  drivers: string[]
  cpus: number
  warmSandboxes: number
  poolFreeBytes: number | undefined
  poolSizeBytes: number | undefined
  /** Incarnation: one more at each registration. */
  epoch: number
  sessions: number
  /** Turns running on the node now (a draining node is drained at 0). */
  runningTurns: number
  leaseLive: boolean
  leaseExpiresAt: string
  heartbeatAt: string
  registeredAt: string
  lostAt: string | undefined
}

/** Only the fields this SDK names (what it returns stays the same whatever a newer server adds). */
function summary(node: NodeInfo): NodeSummary {
  return {
    id: node.id,
    name: node.name,
    address: node.address,
    bootId: node.bootId,
    state: node.state,
    drivers: [...node.drivers],
    cpus: node.cpus,
    warmSandboxes: node.warmSandboxes,
    poolFreeBytes: node.poolFreeBytes,
    poolSizeBytes: node.poolSizeBytes,
    epoch: node.epoch,
    sessions: node.sessions,
    runningTurns: node.runningTurns,
    leaseLive: node.leaseLive,
    leaseExpiresAt: node.leaseExpiresAt,
    heartbeatAt: node.heartbeatAt,
    registeredAt: node.registeredAt,
    lostAt: node.lostAt,
  }
}

/** The cluster's runtime nodes (`/v1/nodes`): list, cordon, uncordon, drain. Install admin keys only. */
export class Nodes {
  constructor(private readonly http: HttpClient) {}

  /** Every node (empty when the server is not in a cluster). */
  async list(options: RequestOptions = {}): Promise<NodeSummary[]> {
    const body = await this.http.json({ method: 'GET', path: '/v1/nodes', ...options })
    return checked(valid.NodeList, body, 'node list').data.map(summary)
  }

  /** Cordon (keeps its sessions, takes no new ones), uncordon, or drain a node; the node as it is now. */
  async apply(id: string, action: NodeAction, options: RequestOptions = {}): Promise<NodeSummary> {
    const body = await this.http.json({
      method: 'POST',
      path: `/v1/nodes/${encodeURIComponent(id)}/${action}`,
      ...options,
    })
    return summary(checked(valid.Node, body, 'node'))
  }

  cordon(id: string, options: RequestOptions = {}): Promise<NodeSummary> {
    return this.apply(id, 'cordon', options)
  }

  uncordon(id: string, options: RequestOptions = {}): Promise<NodeSummary> {
    return this.apply(id, 'uncordon', options)
  }

  /** Drain: no new sessions; the node is drained once `runningTurns` is 0 (see `cairn nodes drain`). */
  drain(id: string, options: RequestOptions = {}): Promise<NodeSummary> {
    return this.apply(id, 'drain', options)
  }

  /**
   * Moves a session to another node (`toNode`, or the one placement picks): its workspace crosses
   * while the session is held (a message sent meanwhile gets `session_moving`, retryable), then
   * its owner changes. Install admin keys only.
   */
  async moveSession(
    sessionId: string,
    move: { toNode?: string } = {},
    options: RequestOptions = {},
  ): Promise<SessionMove> {
    const body = await this.http.json({
      method: 'POST',
      path: `/v1/sessions/${encodeURIComponent(sessionId)}/move`,
      json: move.toNode === undefined ? {} : { toNode: move.toNode },
      ...options,
    })
    return checked(valid.SessionMove, body, 'session move')
  }
}
