import { CairnProblem } from '@cairn/protocol'
import { type ShippingBucket, type ShippingObserver, WorkspaceShipper } from '../shipping/index.js'
import type { EnvStore } from '../storage/env-store.js'
import type { StoragePool } from '../storage/pool.js'
import type { ShippedTree } from './pool-tree-shipping.js'
import { currentOwnerEpoch } from './remote/owner-epoch.js'
import type { BucketRestore, NodeShippingLag, ShippedHead } from './runtime-port.js'

/** A chain link the bucket confirmed, with the owner epoch its snapshot was taken under. */
export interface ConfirmedShip {
  sessionId: string
  snapshotId: string
  generation: number
  shippedAt: string
  /** The chain link's number and its tree's digest: what a restore is pinned to (`ShippedHead`). */
  seq: number
  treeDigest: string
  /** The session's owner epoch the snapshot call came with (undefined: not called remotely). */
  ownerEpoch: number | undefined
}

/** A node's shipping bucket and what it does with it (docs/shipping.md). */
export interface PortShippingOptions {
  bucket: ShippingBucket
  /** See `WorkspaceShipperOptions`. */
  fullEvery?: number | undefined
  retryInitialMs?: number | undefined
  retryMaxMs?: number | undefined
  observer?: ShippingObserver | undefined
  /**
   * Whether the node still owns the session at the epoch the snapshot was taken under; asked
   * before each link is written (see `WorkspaceShipperOptions.mayShip`).
   */
  owns?: ((sessionId: string, ownerEpoch: number | undefined) => Promise<boolean>) | undefined
  /** Told of each confirmed link, to record it (the node writes it to the cluster's database). */
  confirmed?: ((ship: ConfirmedShip) => void) | undefined
}

/** How many snapshot epochs are remembered at most (a snapshot pruned unshipped is forgotten here). */
const MAX_REMEMBERED = 10_000

/**
 * The port's side of shipping: snapshots enqueued on the node's `WorkspaceShipper`, each
 * remembered with the owner epoch it was taken under so that its confirmation is recorded only
 * for that epoch; restores and trees through the same bucket.
 */
export class PortShipping {
  private readonly shipper: WorkspaceShipper
  private readonly epochs = new Map<string, number | undefined>()

  constructor(pool: StoragePool, envs: EnvStore, options: PortShippingOptions) {
    this.shipper = new WorkspaceShipper({
      pool,
      bucket: options.bucket,
      ...(options.fullEvery === undefined ? {} : { fullEvery: options.fullEvery }),
      ...(options.retryInitialMs === undefined ? {} : { retryInitialMs: options.retryInitialMs }),
      ...(options.retryMaxMs === undefined ? {} : { retryMaxMs: options.retryMaxMs }),
      ...(options.owns
        ? {
            mayShip: (sessionId: string, snapshotId: string) =>
              (options.owns as NonNullable<PortShippingOptions['owns']>)(
                sessionId,
                this.epochs.get(snapshotId),
              ),
          }
        : {}),
      locateTree: (kind, id) => {
        if (kind === 'revision') return pool.revisionPath(id)
        if (kind === 'environment') return envs.envPath(id)
        throw new CairnProblem('unavailable', `trees of kind ${kind} are not shipped by the port`)
      },
      observer: {
        ...options.observer,
        shipped: (event) => {
          options.observer?.shipped?.(event)
          const { link } = event
          const ownerEpoch = this.epochs.get(link.snapshotId)
          this.epochs.delete(link.snapshotId)
          options.confirmed?.({
            sessionId: event.sessionId,
            snapshotId: link.snapshotId,
            generation: link.generation,
            shippedAt: link.shippedAt,
            seq: link.seq,
            treeDigest: link.treeDigest,
            ownerEpoch,
          })
        },
      },
    })
  }

  /** Queues the snapshot for shipping under the caller's owner epoch; never waits. */
  enqueue(sessionId: string, snapshotId: string): void {
    if (this.epochs.size >= MAX_REMEMBERED) {
      const oldest = this.epochs.keys().next().value
      if (oldest !== undefined) this.epochs.delete(oldest)
    }
    this.epochs.set(snapshotId, currentOwnerEpoch())
    this.shipper.enqueue(sessionId, snapshotId)
  }

  async restore(sessionId: string, tenantId: string, expected: ShippedHead): Promise<BucketRestore> {
    const restored = await this.shipper.restoreFromBucket(sessionId, tenantId, expected)
    return {
      snapshotId: restored.snapshotId,
      generation: restored.generation,
      seq: restored.seq,
      treeDigest: restored.treeDigest,
      shippedAt: restored.shippedAt,
      streamBytes: restored.streamBytes,
    }
  }

  shipTree(tree: ShippedTree): Promise<{ shipped: boolean }> {
    return 'revisionId' in tree
      ? this.shipper.shipTree('revision', tree.revisionId)
      : this.shipper.shipTree('environment', tree.dependencyEnvKey)
  }

  fetchTree(tree: ShippedTree, tenantId: string): Promise<void> {
    return 'revisionId' in tree
      ? this.shipper.fetchTree('revision', tree.revisionId, tenantId)
      : this.shipper.fetchTree('environment', tree.dependencyEnvKey, tenantId)
  }

  lag(): NodeShippingLag {
    return { enabled: true, ...this.shipper.lag() }
  }

  /** Waits until the session has nothing left to ship (tests, a drain). */
  flush(sessionId: string): Promise<void> {
    return this.shipper.flush(sessionId)
  }

  close(): Promise<void> {
    return this.shipper.close()
  }
}

/** What a node without a bucket answers to a bucket call. */
export function noBucket(): CairnProblem {
  return new CairnProblem(
    'unavailable',
    'this node has no shipping bucket (set CAIRN_S3_BUCKET or --s3-bucket on the node)',
  )
}
