import { CairnProblem } from '@cairn/protocol'
import type {
  ImageBuildContext,
  ImageRecipe,
  ImageRecord,
  IsolationName,
  NodeShippingLag,
  PoolArea,
  PoolQuotaStatus,
  PoolStats,
  RuntimeDescription,
  SandboxDriverFacts,
  TreeSizes,
} from '@cairn/runtime/port'
import { type ClusterRoutes, parseDrivers } from './cluster-routes.js'
import type { ClusterRuntimePortOptions } from './cluster-runtime-port-options.js'
import { SERVING_STATES } from './revision-shipping.js'

/**
 * The part of `ClusterRuntimePort` about no one session: calls every serving node answers (their
 * answers added up, or each node told), or any one of them answers for the cluster (every node
 * runs with the same storage flags): pool figures, drivers, stored names, memory checkpoints'
 * expiry, shipping lag, images and agents' memory.
 */
export abstract class ClusterFanOut {
  /** How calls find their node. */
  protected abstract readonly routes: ClusterRoutes

  constructor(protected readonly options: ClusterRuntimePortOptions) {}

  /**
   * Nothing: an API replica that shuts down leaves the nodes' sandboxes to their sessions (each
   * node stops its own when it shuts down or its keep-warm windows end).
   */
  async stopAllAgents(): Promise<void> {}

  /** The warm sandboxes of every node, as their last heartbeats counted them. */
  async warmCount(): Promise<number> {
    return (await this.options.directory.nodes())
      .filter((node) => SERVING_STATES.has(node.state))
      .reduce((sum, node) => sum + Number(node.warm_sandboxes), 0)
  }

  /** The pools of every serving node, added up (a node that does not answer is left out). */
  async poolStats(): Promise<PoolStats> {
    const stats = await this.routes.fromEveryNode((port) => port.poolStats())
    return stats.reduce(
      (sum, s) => ({
        totalBytes: sum.totalBytes + s.totalBytes,
        usedBytes: sum.usedBytes + s.usedBytes,
        freeBytes: sum.freeBytes + s.freeBytes,
      }),
      { totalBytes: 0, usedBytes: 0, freeBytes: 0 },
    )
  }

  /** The limits of a ready node (every node of a cluster runs with the same storage flags). */
  async quotaStatus(): Promise<PoolQuotaStatus> {
    return (await this.routes.anyNode()).port.quotaStatus()
  }

  /** Each tenant's trees on every node, added up. */
  async tenantUsage(tenantIds: readonly string[]): Promise<Record<string, TreeSizes>> {
    const usage: Record<string, TreeSizes> = {}
    for (const perNode of await this.routes.fromEveryNode((port) => port.tenantUsage(tenantIds))) {
      for (const [tenantId, sizes] of Object.entries(perNode)) {
        const sum = usage[tenantId] ?? { referencedBytes: 0, exclusiveBytes: 0 }
        usage[tenantId] = {
          referencedBytes: sum.referencedBytes + sizes.referencedBytes,
          exclusiveBytes: sum.exclusiveBytes + sizes.exclusiveBytes,
        }
      }
    }
    return usage
  }

  /** A node that runs the driver answers for it. */
  async sandboxDriver(isolation?: IsolationName | undefined): Promise<SandboxDriverFacts> {
    const nodes = await this.routes.servingNodes()
    const withDriver = isolation
      ? nodes.find(({ node }) => parseDrivers(node.drivers).includes(isolation))
      : undefined
    return (withDriver ?? (await this.routes.anyNode())).port.sandboxDriver(isolation)
  }

  async describe(): Promise<RuntimeDescription> {
    return (await this.routes.anyNode()).port.describe()
  }

  /** The names stored in that area on any serving node. */
  async listStored(area: PoolArea): Promise<string[]> {
    return [...new Set((await this.routes.fromEveryNode((port) => port.listStored(area))).flat())]
  }

  async discardStaging(name: string): Promise<void> {
    await this.routes.fromEveryNode((port) => port.discardStaging(name))
  }

  // --- reading trees --------------------------------------------------------------------------
  async expireMemoryCheckpoints(cutoff: Date): Promise<{ sessionId: string; bytes: number }[]> {
    return (await this.routes.fromEveryNode((port) => port.expireMemoryCheckpoints(cutoff))).flat()
  }

  /** Each serving node's shipping lag (`/metrics`); a node that does not answer is left out. */
  async shippingLagByNode(): Promise<{ node: string; lag: NodeShippingLag }[]> {
    const nodes = await this.routes.servingNodes()
    const settled = await Promise.allSettled(nodes.map(({ port }) => port.shippingLag()))
    return nodes.flatMap(({ node }, i) => {
      const result = settled[i]
      return result?.status === 'fulfilled' ? [{ node: node.id, lag: result.value }] : []
    })
  }

  /** Summed over the serving nodes; the oldest unshipped snapshot anywhere. */
  async shippingLag(): Promise<NodeShippingLag> {
    const lags = await this.routes.fromEveryNode((port) => port.shippingLag())
    return lags.reduce(
      (sum, lag) => ({
        enabled: sum.enabled || lag.enabled,
        unshippedSnapshots: sum.unshippedSnapshots + lag.unshippedSnapshots,
        secondsBehind: Math.max(sum.secondsBehind, lag.secondsBehind),
        failingSessions: sum.failingSessions + lag.failingSessions,
      }),
      { enabled: false, unshippedSnapshots: 0, secondsBehind: 0, failingSessions: 0 },
    )
  }

  // --- images: every serving node holds the images its sessions may need --------------------
  async imageKeyOf(recipe: ImageRecipe, ctx: ImageBuildContext): Promise<string | undefined> {
    return (await this.routes.anyNode()).port.imageKeyOf(recipe, ctx)
  }

  /** Built only when every serving node has it (so that a deploy builds it where it is missing). */
  async hasImage(key: string): Promise<boolean> {
    const answers = await Promise.all(
      (await this.routes.servingNodes()).map(({ port }) => port.hasImage(key)),
    )
    return answers.length > 0 && answers.every(Boolean)
  }

  async ensureImage(recipe: ImageRecipe, key: string, ctx: ImageBuildContext): Promise<void> {
    const nodes = await this.routes.servingNodes()
    if (nodes.length === 0) throw new CairnProblem('node_unavailable', 'no runtime node is serving')
    await Promise.all(nodes.map(({ port }) => port.ensureImage(recipe, key, ctx)))
  }

  async image(key: string): Promise<ImageRecord | undefined> {
    for (const record of await this.routes.fromEveryNode((port) => port.image(key))) if (record) return record
    return undefined
  }

  /** Each image once (by key), as the first node that holds it describes it. */
  async listImages(): Promise<ImageRecord[]> {
    const byKey = new Map<string, ImageRecord>()
    for (const record of (await this.routes.fromEveryNode((port) => port.listImages())).flat())
      if (!byKey.has(record.key)) byKey.set(record.key, record)
    return [...byKey.values()]
  }

  async removeImage(key: string): Promise<void> {
    const nodes = await this.routes.servingNodes()
    await Promise.all(
      nodes.map(async ({ port }) => {
        if (await port.hasImage(key)) await port.removeImage(key)
      }),
    )
  }

  // --- agent memory ---------------------------------------------------------------------------
  async publishMemory(agentId: string, version: number, content: string): Promise<void> {
    const nodes = await this.routes.servingNodes()
    await Promise.all(nodes.map(({ port }) => port.publishMemory(agentId, version, content)))
  }
}
