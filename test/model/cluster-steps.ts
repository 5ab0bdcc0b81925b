import fc from 'fast-check'
import type { ModelClient } from './client.js'
import { Violation } from './client.js'
import type { ClusterSystem } from './cluster-system.js'
import { type InFlight, InFlightFault, type InFlightTarget, inFlight } from './faults.js'
import type { Model } from './model.js'
import { index } from './operations.js'
import { Step, unexpected } from './step.js'
import { sleep } from './system.js'

/** How long a drain may take to empty a node of a sequence's few idle sessions (the leader moves 4 a second). */
export const DRAIN_BOUND_MS = 30_000
/** Down times: back at once, or after the cluster's verdict (a 2 s lease and a leader's check). */
const DOWN_MS = [0, 3000] as const

interface NodeView {
  id: string
  name: string
  state: string
  sessions: number
  runningTurns: number
}

async function nodeViews(real: ClusterSystem): Promise<NodeView[]> {
  const answer = await real.client.call('GET', '/v1/nodes')
  if (answer.status !== 200)
    throw new Violation(`GET /v1/nodes: ${answer.status} ${JSON.stringify(answer.body)}`)
  return (answer.body.data as NodeView[]).sort((a, b) => a.name.localeCompare(b.name))
}

/** `POST /v1/sessions/{id}/move` (placement picks the target): the workspace goes along, byte for byte. */
export class Move extends Step<ClusterSystem> {
  readonly kind = 'move'
  constructor(readonly index: number) {
    super()
  }
  protected async apply(model: Model, real: ClusterSystem) {
    const session = model.pick(this.index)
    if (!session) return
    const answer = await real.unlessBusy(`${session.label} move`, () =>
      real.client.call('POST', `/v1/sessions/${session.id}/move`, {}),
    )
    model.mayHaveMoved(session)
    if (answer.status !== 200) unexpected(session, 'move', answer)
  }
  toString() {
    return `move(${this.index})`
  }
}

/**
 * `POST /v1/nodes/{id}/drain`: the leader moves the node's sessions to the other one; drained
 * (no session, no running turn) within DRAIN_BOUND_MS; then uncordoned, back to `ready`.
 */
export class Drain extends Step<ClusterSystem> {
  readonly kind = 'drain'
  constructor(readonly node: number) {
    super()
  }
  protected async apply(model: Model, real: ClusterSystem) {
    const node = (await nodeViews(real))[this.node % real.nodes.length] as NodeView
    model.mayHaveMoved()
    const drained = await real.client.call('POST', `/v1/nodes/${node.id}/drain`)
    if (drained.status !== 200)
      throw new Violation(`drain ${node.name}: ${drained.status} ${JSON.stringify(drained.body)}`)
    const deadline = Date.now() + DRAIN_BOUND_MS
    for (;;) {
      const now = (await nodeViews(real)).find((n) => n.id === node.id)
      if (now && now.sessions === 0 && now.runningTurns === 0) break
      if (Date.now() > deadline)
        throw new Violation(`drain ${node.name}: still ${JSON.stringify(now)} ${DRAIN_BOUND_MS} ms on`)
      await sleep(250)
    }
    real.stats.count(real.stats.invariants, 'drained within bound')
    const back = await real.client.call('POST', `/v1/nodes/${node.id}/uncordon`)
    if (back.status !== 200)
      throw new Violation(`uncordon ${node.name}: ${back.status} ${JSON.stringify(back.body)}`)
  }
  toString() {
    return `drain(n${(this.node % 2) + 1})`
  }
}

/** A cluster fault on part `which` (a replica, a node), down for `downMs` before it comes back. */
abstract class PartFault extends InFlightFault<ClusterSystem> {
  /** A node may be declared lost meanwhile, and its sessions recovered on another node. */
  protected readonly losesNodes: boolean = false
  constructor(
    flight: [InFlight, InFlightTarget, number],
    readonly which: number,
    readonly downMs: number,
  ) {
    super(...flight)
  }
  protected abstract get part(): string
  protected get label() {
    return `${this.kind} ${this.part}${this.downMs > 0 ? `, down ${this.downMs} ms` : ''}`
  }
  protected override async apply(model: Model, real: ClusterSystem) {
    try {
      await super.apply(model, real)
    } finally {
      if (this.losesNodes) model.mayHaveMoved()
    }
  }
}

/** A fault of an API replica: the operation in flight goes through it; it is started again in its data dir. */
abstract class ReplicaFault extends PartFault {
  protected get part() {
    return `api${(this.which % 2) + 1}`
  }
  protected override clientOf(real: ClusterSystem): ModelClient {
    return real.client.via(this.which)
  }
  protected async recover(real: ClusterSystem) {
    await real.restartReplica(this.which)
  }
}

/** kill -9 of an API replica, down `downMs` (3 s: past its lease, the leader ends its turns first). */
export class KillReplica extends ReplicaFault {
  readonly kind = 'kill -9 replica'
  protected async strike(real: ClusterSystem) {
    await real.killReplica(this.which)
    await sleep(this.downMs)
  }
}

/** SIGTERM to every process of an API replica (systemd's KillMode=control-group): it exits 0 within the stop bound. */
export class TerminateReplica extends ReplicaFault {
  readonly kind = 'SIGTERM replica'
  protected async strike(real: ClusterSystem) {
    await real.terminateReplica(this.which)
  }
}

/**
 * kill -9 of a `cairn node` (its sandboxes live on), down `downMs` (3 s: past its lease, the
 * leader's verdict `node_lost` comes first), then started again on its data dir. Meanwhile a
 * request to its sessions may answer `503 node_lost` (docs/cluster.md).
 */
export class KillNode extends PartFault {
  readonly kind = 'kill -9 node'
  protected override readonly losesNodes = true
  protected override readonly windowCodes = ['node_lost', 'node_unavailable', 'unavailable']
  protected get part() {
    return `n${(this.which % 2) + 1}`
  }
  protected async strike(real: ClusterSystem) {
    await real.nodes[this.which % real.nodes.length]?.kill9()
    await sleep(this.downMs)
  }
  protected async recover(real: ClusterSystem) {
    await real.nodesReady()
  }
}

/** PostgreSQL stopped (every connection drops) for `downMs`, then started: requests meanwhile `503 unavailable`. */
export class RestartPostgres extends PartFault {
  readonly kind = 'PostgreSQL restart'
  protected override readonly losesNodes = true
  protected override readonly windowCodes = ['unavailable', 'node_unavailable', 'node_fenced']
  protected get part() {
    return ''
  }
  /** PostgreSQL's clock once it answered again. */
  private backAt: string | undefined
  protected async strike(real: ClusterSystem) {
    await real.cluster.bed.restartPostgres(this.downMs)
    this.backAt = await real.databaseNow()
  }
  protected async recover(real: ClusterSystem) {
    await real.nodesReady()
    // A node that fenced itself meanwhile serves again once it registered again.
    if (this.backAt) await real.nodesLiveSince(this.backAt)
  }
}

/** The object store's gateway killed for `downMs` (shipping waits), then started again. */
export class StopObjectStore extends PartFault {
  readonly kind = 'object store stopped'
  protected get part() {
    return ''
  }
  protected async strike(real: ClusterSystem) {
    real.store.killGateway()
    await sleep(this.downMs)
  }
  protected async recover(real: ClusterSystem) {
    await real.store.startGateway()
  }
}

const part = fc.nat(1)
const downMs = fc.constantFrom(...DOWN_MS)

export function clusterSteps(): fc.Arbitrary<Step<ClusterSystem>>[] {
  return [
    index.map((i) => new Move(i)),
    part.map((n) => new Drain(n)),
    fc.tuple(inFlight, part, downMs).map(([f, p, d]) => new KillReplica(f, p, d)),
    fc.tuple(inFlight, part).map(([f, p]) => new TerminateReplica(f, p, 0)),
    fc.tuple(inFlight, part, downMs).map(([f, p, d]) => new KillNode(f, p, d)),
    fc.tuple(inFlight, fc.constantFrom(0, 1500)).map(([f, d]) => new RestartPostgres(f, 0, d)),
    fc.tuple(inFlight, fc.constantFrom(500, 3000)).map(([f, d]) => new StopObjectStore(f, 0, d)),
  ]
}
