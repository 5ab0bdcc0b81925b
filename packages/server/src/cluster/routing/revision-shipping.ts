import { CairnProblem } from '@cairn/protocol'
import type { RuntimePort, ShippedTree } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { ClusterRows } from './cluster-rows.js'
import type { NodeDirectory, NodeRow } from './node-directory.js'

/** Node states whose pools can be read from (a cordoned or draining node still serves its trees). */
export const SERVING_STATES = new Set(['ready', 'cordoned', 'draining'])

/**
 * Revisions reach a node before its first session of them: the tree and its dependency
 * environment are streamed from a node that holds them (`exportPoolTree` → `importPoolTree`),
 * once per node (concurrent sessions wait for the one shipment), then recorded in `revision_nodes`.
 */
export class RevisionShipping {
  private readonly inFlight = new Map<string, Promise<void>>()

  constructor(
    private readonly rows: ClusterRows,
    private readonly directory: NodeDirectory,
    private readonly logger: Logger,
  ) {}

  /** Makes sure node `target` holds the revision (shipping it there unless it does). */
  async ensure(target: NodeRow, revisionId: string): Promise<void> {
    if ((await this.rows.revisionHolders(revisionId)).includes(target.id)) return
    const key = `${target.id} ${revisionId}`
    let shipping = this.inFlight.get(key)
    if (!shipping) {
      shipping = this.ship(target, revisionId).finally(() => this.inFlight.delete(key))
      this.inFlight.set(key, shipping)
    }
    await shipping
  }

  private async ship(target: NodeRow, revisionId: string): Promise<void> {
    const holders = await this.rows.revisionHolders(revisionId, true)
    if (holders.includes(target.id)) return
    const nodes = await this.directory.nodes()
    const sources = holders
      .map((id) => nodes.find((node) => node.id === id))
      .filter((node): node is NodeRow => node !== undefined && SERVING_STATES.has(node.state))
    if (sources.length === 0)
      throw new CairnProblem(
        'node_unavailable',
        `no reachable node holds revision ${revisionId} (held by: ${holders.join(', ') || 'none'})`,
        { revisionId, holders },
      )
    const facts = await this.rows.revisionFacts(revisionId)
    const to = this.directory.port(target)
    let lastError: unknown
    for (const source of sources) {
      const from = this.directory.port(source)
      const startedMs = performance.now()
      try {
        if (facts.envKey) await copyTree(from, to, { dependencyEnvKey: facts.envKey }, facts.tenantId)
        await copyTree(from, to, { revisionId }, facts.tenantId)
        await this.rows.addRevisionHolder(revisionId, target.id)
        this.logger.info(
          { revisionId, from: source.id, to: target.id, ms: Math.round(performance.now() - startedMs) },
          'shipped a revision to a node',
        )
        return
      } catch (error) {
        lastError = error
        this.logger.warn(
          { err: error, revisionId, from: source.id, to: target.id },
          'shipping a revision failed',
        )
      }
    }
    throw lastError
  }
}

async function copyTree(
  from: RuntimePort,
  to: RuntimePort,
  tree: ShippedTree,
  tenantId: string,
): Promise<void> {
  const stream = await from.exportPoolTree(tree)
  try {
    await to.importPoolTree(tree, tenantId, stream)
  } finally {
    stream.destroy()
  }
}
