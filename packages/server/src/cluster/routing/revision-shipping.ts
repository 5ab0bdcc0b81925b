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
 * When no node that holds it answers, the target fetches both from the shipping bucket (a
 * revision is shipped there once, when it is sealed: `shipSealed`).
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
    const facts = await this.rows.revisionFacts(revisionId)
    const to = this.directory.port(target)
    let lastError: unknown = new CairnProblem(
      'node_unavailable',
      `no reachable node holds revision ${revisionId} (held by: ${holders.join(', ') || 'none'})`,
      { revisionId, holders },
    )
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
    // No node that holds it answers (the one that built it is gone): from the shipping bucket,
    // where it was shipped once when it was sealed.
    const startedMs = performance.now()
    try {
      if (facts.envKey) await fetchOnce(to, { dependencyEnvKey: facts.envKey }, facts.tenantId)
      await fetchOnce(to, { revisionId }, facts.tenantId)
      await this.rows.addRevisionHolder(revisionId, target.id)
      this.logger.info(
        { revisionId, to: target.id, ms: Math.round(performance.now() - startedMs) },
        'fetched a revision from the shipping bucket',
      )
      return
    } catch (error) {
      this.logger.warn(
        { err: error, revisionId, to: target.id },
        'fetching a revision from the bucket failed',
      )
      if (!(error instanceof CairnProblem) || error.code !== 'unavailable') lastError = error
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

/** Fetches a tree from the bucket; one the node already has (a `conflict`) is kept. */
async function fetchOnce(port: RuntimePort, tree: ShippedTree, tenantId: string): Promise<void> {
  try {
    await port.fetchPoolTree(tree, tenantId)
  } catch (error) {
    if (error instanceof CairnProblem && error.code === 'conflict') return
    throw error
  }
}

/**
 * Ships a sealed revision and its dependency environment to the bucket once, from the node that
 * sealed it, in the background (a deploy never waits for it); a node without a bucket skips it.
 */
export function shipSealed(
  port: RuntimePort,
  revisionId: string,
  envKey: string | undefined,
  logger: Logger,
): void {
  void (async () => {
    try {
      if (envKey) await port.shipPoolTree({ dependencyEnvKey: envKey })
      await port.shipPoolTree({ revisionId })
    } catch (error) {
      if (error instanceof CairnProblem && error.code === 'unavailable') return
      logger.warn({ err: error, revisionId }, 'shipping a revision to the bucket failed')
    }
  })()
}
