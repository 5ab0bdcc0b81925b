/**
 * Where a new session goes: power of two choices over the nodes that can take it. Pure: the rows
 * (as read from `nodes` and `revision_nodes`), the time and the random source come in, a node ID
 * goes out, so the spread is tested without a cluster.
 */

/** A node as placement sees it: its `nodes` row's figures, plus what this replica placed lately. */
export interface PlacementNode {
  id: string
  /** `ready`, `cordoned`, `draining`, `lost` or `stopped`: only `ready` takes sessions. */
  state: string
  /** The sandbox drivers the node runs (`bwrap`, `gvisor`). */
  drivers: readonly string[]
  cpus: number
  warmSandboxes: number
  poolFreeBytes: number | null
  poolSizeBytes: number | null
  leaseExpiresAtMs: number
  /** Sessions this replica placed on the node since its row's figures were written. */
  placedSinceHeartbeat?: number | undefined
}

export interface PlacementRequest {
  /** The sandbox driver the agent runs under; undefined: any (the node's default). */
  driver?: string | undefined
  /** Nodes already holding the agent's revision (and its dependency environment). */
  revisionHolders: ReadonlySet<string>
  /** The pool space a node must have free to take the session. */
  minFreeBytes: number
  nowMs: number
}

/** Why no node can take a session (each node's reason, for the error's details). */
export class NoNodeAvailable extends Error {
  constructor(readonly reasons: Record<string, string>) {
    super(
      Object.keys(reasons).length === 0
        ? 'no runtime node is registered'
        : `no runtime node can take the session: ${Object.entries(reasons)
            .map(([id, why]) => `${id} ${why}`)
            .join('; ')}`,
    )
  }
}

/**
 * What holding the revision is worth, in warm sandboxes per CPU: a node that has it wins over one
 * that must be shipped it until it runs about half a sandbox per CPU more.
 */
export const REVISION_HELD_BONUS = 0.5

/** Why the node cannot take the session; undefined: it can. */
export function unfitBecause(node: PlacementNode, request: PlacementRequest): string | undefined {
  if (node.state !== 'ready') return `is ${node.state}`
  if (node.leaseExpiresAtMs <= request.nowMs) return 'has no live lease'
  if (request.driver !== undefined && !node.drivers.includes(request.driver))
    return `has no ${request.driver} driver`
  if (node.poolFreeBytes !== null && node.poolFreeBytes < request.minFreeBytes)
    return `has ${node.poolFreeBytes} bytes free in its pool (${request.minFreeBytes} needed)`
  return undefined
}

/** Lower is better: warm sandboxes per CPU, plus the pool's used share, less the revision bonus. */
export function placementScore(node: PlacementNode, request: PlacementRequest): number {
  const warm = node.warmSandboxes + (node.placedSinceHeartbeat ?? 0)
  const perCpu = warm / Math.max(1, node.cpus)
  const poolUse =
    node.poolSizeBytes && node.poolFreeBytes !== null
      ? Math.min(1, Math.max(0, 1 - node.poolFreeBytes / node.poolSizeBytes))
      : 0
  const bonus = request.revisionHolders.has(node.id) ? REVISION_HELD_BONUS : 0
  return perCpu + poolUse - bonus
}

/**
 * Power of two choices: two distinct fit nodes drawn at random, the better scored one taken (the
 * first drawn on a tie). One fit node is taken as it is; none throws `NoNodeAvailable`.
 * `random` answers in [0, 1) like `Math.random`.
 */
export function placeSession(
  nodes: readonly PlacementNode[],
  request: PlacementRequest,
  random: () => number,
): string {
  const fit: PlacementNode[] = []
  const reasons: Record<string, string> = {}
  for (const node of nodes) {
    const why = unfitBecause(node, request)
    if (why === undefined) fit.push(node)
    else reasons[node.id] = why
  }
  const [only] = fit
  if (only === undefined) throw new NoNodeAvailable(reasons)
  if (fit.length === 1) return only.id
  const first = Math.min(fit.length - 1, Math.floor(random() * fit.length))
  let second = Math.min(fit.length - 2, Math.floor(random() * (fit.length - 1)))
  if (second >= first) second += 1
  const a = fit[first] as PlacementNode
  const b = fit[second] as PlacementNode
  return placementScore(b, request) < placementScore(a, request) ? b.id : a.id
}
