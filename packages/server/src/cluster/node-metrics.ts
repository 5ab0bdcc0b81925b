import type { NodeInfo } from '@cairn/protocol'
import type { MetricsRegistry } from '../metrics/registry.js'

/**
 * The nodes' figures in `/metrics`, one series per node (label `node`: its ID): whether it is up
 * (a live lease in a leased state), its state, CPUs, warm sandboxes, pool space, sessions and
 * running turns. Returns what reads the nodes before each scrape.
 */
export function installNodeMetrics(
  metrics: MetricsRegistry,
  list: () => Promise<NodeInfo[]>,
): () => Promise<void> {
  let nodes: NodeInfo[] = []
  const perNode = (name: string, help: string, value: (node: NodeInfo) => number | undefined) =>
    metrics.gauge({
      name,
      help,
      labelNames: ['node'],
      read: () =>
        nodes.flatMap((node) => {
          const v = value(node)
          return v === undefined ? [] : [{ labels: { node: node.id }, value: v }]
        }),
    })
  perNode('cairn_node_up', 'Whether the node holds a live lease (1) or not (0)', (n) =>
    n.leaseLive && ['ready', 'cordoned', 'draining'].includes(n.state) ? 1 : 0,
  )
  metrics.gauge({
    name: 'cairn_node_state',
    help: "The node's state (1 for the state it is in)",
    labelNames: ['node', 'state'],
    read: () => nodes.map((node) => ({ labels: { node: node.id, state: node.state }, value: 1 })),
  })
  perNode('cairn_node_cpus', "The node's CPUs", (n) => n.cpus)
  perNode('cairn_node_sandboxes_warm', 'Warm sandboxes on the node (last heartbeat)', (n) => n.warmSandboxes)
  perNode(
    'cairn_node_pool_free_bytes',
    "Free bytes in the node's storage pool (last heartbeat)",
    (n) => n.poolFreeBytes,
  )
  perNode('cairn_node_pool_size_bytes', "Size of the node's storage pool", (n) => n.poolSizeBytes)
  perNode('cairn_node_sessions', 'Sessions the node owns', (n) => n.sessions)
  perNode('cairn_node_turns_running', 'Turns running on the node', (n) => n.runningTurns)
  perNode('cairn_node_epoch', "The node's incarnation (registrations so far)", (n) => n.epoch)
  return async () => {
    nodes = await list().catch(() => nodes)
  }
}
