import type { NodeShippingLag } from '@cairn/runtime/port'
import type { MetricsRegistry } from './registry.js'

/** One node's shipping lag (label `node`: its ID; a single process: its runtime ID or `local`). */
export interface NodeLag {
  node: string
  lag: NodeShippingLag
}

/**
 * Shipping lag per node in `/metrics` (docs/shipping.md): snapshots taken and not yet confirmed
 * in the bucket, how long the oldest of them has waited, and the sessions whose shipping is failing. Nodes without a bucket are left
 * out. Returns what reads the figures before each scrape.
 */
export function installShippingMetrics(
  metrics: MetricsRegistry,
  read: () => Promise<NodeLag[]>,
): () => Promise<void> {
  let lags: NodeLag[] = []
  const perNode = (name: string, help: string, value: (lag: NodeShippingLag) => number) =>
    metrics.gauge({
      name,
      help,
      labelNames: ['node'],
      read: () =>
        lags.filter((l) => l.lag.enabled).map((l) => ({ labels: { node: l.node }, value: value(l.lag) })),
    })
  perNode(
    'cairn_node_shipping_unshipped_snapshots',
    'Snapshots the node took that the shipping bucket has not confirmed yet',
    (lag) => lag.unshippedSnapshots,
  )
  perNode(
    'cairn_node_shipping_lag_seconds',
    'How long the oldest unshipped snapshot of the node has waited for the bucket',
    (lag) => lag.secondsBehind,
  )
  perNode(
    'cairn_node_shipping_failing_sessions',
    'Sessions whose last attempt to ship to the bucket failed (the store down or hung); retried with backoff',
    (lag) => lag.failingSessions,
  )
  return async () => {
    lags = await read().catch(() => lags)
  }
}
