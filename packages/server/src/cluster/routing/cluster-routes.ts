import { CairnProblem } from '@cairn/protocol'
import { type RuntimePort, runWithOwnerEpoch, type TreeRef } from '@cairn/runtime/port'
import type { ClusterRows } from './cluster-rows.js'
import type { ClusterRuntimePortOptions } from './cluster-runtime-port-options.js'
import type { NodeRow } from './node-directory.js'
import { NoNodeAvailable, type PlacementNode, placeSession } from './placement.js'
import { SERVING_STATES } from './revision-shipping.js'

/** A node's port, with what is known of it: its row and, for a session, the epoch calls carry. */
export interface Route {
  node: NodeRow
  port: RuntimePort
  ownerEpoch: number
}

/**
 * Which node a call goes to (see `ClusterRuntimePort`): a session's, a snapshot's session's, a
 * revision holder, a deploy's, every serving node, or a new session's by placement.
 */
export class ClusterRoutes {
  /** Revisions being deployed, by ID: the node they were staged on. */
  readonly staged = new Map<string, string>()
  /** Sessions placed on a node since the heartbeat its row's figures are from. */
  private readonly placedSince = new Map<string, { heartbeatAt: string; count: number }>()

  constructor(
    private readonly options: ClusterRuntimePortOptions,
    private readonly rows: ClusterRows,
  ) {}

  /** The node's port, refused as `node_lost` or `node_unavailable` when it cannot serve. */
  async nodePort(nodeId: string): Promise<{ node: NodeRow; port: RuntimePort }> {
    return this.serving(nodeId, await this.options.directory.node(nodeId))
  }

  private serving(nodeId: string, node: NodeRow | undefined): { node: NodeRow; port: RuntimePort } {
    if (!node) throw new CairnProblem('node_unavailable', `node ${nodeId} is not registered`, { nodeId })
    if (node.state === 'lost')
      throw new CairnProblem(
        'node_lost',
        `node ${nodeId} was declared lost at ${node.lost_at ?? 'an unknown time'}; its sessions are served again when it comes back`,
        { nodeId },
      )
    if (!SERVING_STATES.has(node.state))
      throw new CairnProblem('node_unavailable', `node ${nodeId} is ${node.state}`, { nodeId })
    return { node, port: this.options.directory.port(node) }
  }

  async sessionRoute(sessionId: string): Promise<Route> {
    const home = await this.rows.home(sessionId)
    return { ...(await this.nodePort(home.nodeId)), ownerEpoch: home.ownerEpoch }
  }

  /**
   * What a node that could not be reached stands for: its row read again (the cached one may be
   * from before the leader declared it lost), `node_lost` if it now says so, else the error itself.
   */
  async explain(error: unknown, nodeId: string): Promise<unknown> {
    if (!(error instanceof CairnProblem) || error.code !== 'node_unavailable') return error
    const fresh = (await this.options.directory.nodes(true).catch(() => [])).find((n) => n.id === nodeId)
    if (fresh?.state !== 'lost') return error
    try {
      this.serving(nodeId, fresh)
    } catch (problem) {
      return problem
    }
    return error
  }

  /**
   * Runs `call` on the session's node under its owner epoch (once more on `stale_epoch`). A
   * session whose node was declared lost is first recovered on another node from the shipping
   * bucket (`recovery`, when set and `recover` is not false), then the call goes there.
   */
  async onSession<T>(
    sessionId: string,
    call: (port: RuntimePort) => Promise<T>,
    options: { recover?: boolean } = {},
  ): Promise<T> {
    try {
      return await this.onSessionOnce(sessionId, call)
    } catch (error) {
      if (!this.recovery || options.recover === false || !isNodeLost(error)) throw error
      try {
        await this.recovery.recover(sessionId)
      } catch (problem) {
        // No bucket on the nodes: the session waits for its node as before (node_lost).
        if (problem instanceof CairnProblem && problem.code === 'unavailable') throw error
        throw problem
      }
      this.rows.forget(sessionId)
      // Moved here or by another replica meanwhile: the call goes to the session's node now.
      return this.onSessionOnce(sessionId, call)
    }
  }

  /** Recovers sessions of lost nodes (set by `ClusterRuntimePort` when shipping is on). */
  recovery: { recover(sessionId: string): Promise<unknown> } | undefined

  private async onSessionOnce<T>(sessionId: string, call: (port: RuntimePort) => Promise<T>): Promise<T> {
    const route = await this.sessionRoute(sessionId)
    try {
      return await runWithOwnerEpoch(route.ownerEpoch, () => call(route.port))
    } catch (error) {
      if (error instanceof CairnProblem && error.code === 'node_unavailable')
        throw await this.explain(error, route.node.id)
      // The node has seen a newer owner epoch than the one cached here (another replica read it
      // first): the call did nothing; it is made once more with the epoch read again.
      if (!(error instanceof CairnProblem) || error.code !== 'stale_epoch') throw error
      this.rows.forget(sessionId)
      const fresh = await this.sessionRoute(sessionId)
      if (fresh.ownerEpoch === route.ownerEpoch && fresh.node.id === route.node.id) throw error
      return runWithOwnerEpoch(fresh.ownerEpoch, () => call(fresh.port))
    }
  }

  async snapshotRoute(snapshotId: string): Promise<Route> {
    return this.sessionRoute(await this.rows.snapshotSession(snapshotId))
  }

  /** A node that holds the revision and serves (any of them). */
  async revisionRoute(revisionId: string): Promise<Route> {
    const holders = await this.rows.revisionHolders(revisionId)
    const nodes = await this.options.directory.nodes()
    for (const id of holders) {
      const node = nodes.find((row) => row.id === id)
      if (node && SERVING_STATES.has(node.state))
        return { node, port: this.options.directory.port(node), ownerEpoch: 0 }
    }
    throw new CairnProblem(
      'node_unavailable',
      `no reachable node holds revision ${revisionId} (held by: ${holders.join(', ') || 'none'})`,
      { revisionId },
    )
  }

  async stagedRoute(revisionId: string): Promise<Route> {
    const nodeId = this.staged.get(revisionId)
    if (!nodeId) throw new CairnProblem('not_found', `revision ${revisionId} is not being deployed`)
    return { ...(await this.nodePort(nodeId)), ownerEpoch: 0 }
  }

  treeRoute(tree: TreeRef): Promise<Route> {
    if ('sessionId' in tree) return this.sessionRoute(tree.sessionId)
    if ('snapshotId' in tree) return this.snapshotRoute(tree.snapshotId)
    if ('stagedRevisionId' in tree) return this.stagedRoute(tree.stagedRevisionId)
    return this.revisionRoute(tree.revisionId)
  }

  /** Runs a read of a tree on the node that holds it (a session's trees under its epoch). */
  async onTree<T>(tree: TreeRef, call: (port: RuntimePort) => Promise<T>): Promise<T> {
    const route = await this.treeRoute(tree)
    try {
      return await runWithOwnerEpoch(route.ownerEpoch, () => call(route.port))
    } catch (error) {
      throw await this.explain(error, route.node.id)
    }
  }

  /** Every node that serves now (for what is asked of all: images, memory, figures). */
  async servingNodes(): Promise<{ node: NodeRow; port: RuntimePort }[]> {
    const serving = (rows: NodeRow[]) => rows.filter((node) => SERVING_STATES.has(node.state))
    let nodes = serving(await this.options.directory.nodes())
    // None in the cached rows: a node may have registered since.
    if (nodes.length === 0) nodes = serving(await this.options.directory.nodes(true))
    return nodes.map((node) => ({ node, port: this.options.directory.port(node) }))
  }

  async anyNode(): Promise<{ node: NodeRow; port: RuntimePort }> {
    const nodes = await this.servingNodes()
    const ready = nodes.find(({ node }) => node.state === 'ready') ?? nodes[0]
    if (!ready) throw new CairnProblem('node_unavailable', 'no runtime node is serving')
    return ready
  }

  /** Picks a node for a new session (or a deploy) by power of two choices. */
  async place(revisionId: string | undefined): Promise<NodeRow> {
    try {
      return await this.placeOn(await this.options.directory.nodes(), revisionId)
    } catch (error) {
      // Refused on cached rows: a node may have registered or come back since.
      if (!(error instanceof CairnProblem) || error.code !== 'node_unavailable') throw error
      return this.placeOn(await this.options.directory.nodes(true), revisionId)
    }
  }

  async placeOn(nodes: NodeRow[], revisionId: string | undefined): Promise<NodeRow> {
    const facts = revisionId ? await this.rows.revisionFacts(revisionId) : undefined
    const holders = new Set(revisionId ? await this.rows.revisionHolders(revisionId) : [])
    const candidates: PlacementNode[] = nodes.map((node) => {
      const placed = this.placedSince.get(node.id)
      return {
        id: node.id,
        state: node.state,
        drivers: parseDrivers(node.drivers),
        cpus: Number(node.cpus),
        warmSandboxes: Number(node.warm_sandboxes),
        poolFreeBytes: node.pool_free_bytes === null ? null : Number(node.pool_free_bytes),
        poolSizeBytes: node.pool_size_bytes === null ? null : Number(node.pool_size_bytes),
        leaseExpiresAtMs: Date.parse(node.lease_expires_at),
        placedSinceHeartbeat: placed?.heartbeatAt === node.heartbeat_at ? placed.count : 0,
      }
    })
    let nodeId: string
    try {
      nodeId = placeSession(
        candidates,
        {
          driver: facts?.isolation,
          revisionHolders: holders,
          minFreeBytes: this.options.minFreeBytes ?? 64 * 1024 * 1024,
          nowMs: (this.options.now ?? Date.now)(),
        },
        this.options.random ?? Math.random,
      )
    } catch (error) {
      if (error instanceof NoNodeAvailable)
        throw new CairnProblem('node_unavailable', error.message, { nodes: error.reasons })
      throw error
    }
    const node = nodes.find((row) => row.id === nodeId) as NodeRow
    const placed = this.placedSince.get(nodeId)
    this.placedSince.set(nodeId, {
      heartbeatAt: node.heartbeat_at,
      count: placed?.heartbeatAt === node.heartbeat_at ? placed.count + 1 : 1,
    })
    return node
  }

  /** Asks every serving node; those that fail are logged and left out of the answer. */
  async fromEveryNode<T>(call: (port: RuntimePort) => Promise<T>): Promise<T[]> {
    const nodes = await this.servingNodes()
    const settled = await Promise.allSettled(nodes.map(({ port }) => call(port)))
    const answers: T[] = []
    settled.forEach((result, i) => {
      if (result.status === 'fulfilled') answers.push(result.value)
      else this.options.logger.warn({ err: result.reason, node: nodes[i]?.node.id }, 'a node did not answer')
    })
    return answers
  }
}

function parseDrivers(json: string): string[] {
  try {
    const parsed: unknown = JSON.parse(json)
    return Array.isArray(parsed) ? parsed.filter((d): d is string => typeof d === 'string') : []
  } catch {
    return []
  }
}

export { parseDrivers }

function isNodeLost(error: unknown): boolean {
  return error instanceof CairnProblem && error.code === 'node_lost'
}
