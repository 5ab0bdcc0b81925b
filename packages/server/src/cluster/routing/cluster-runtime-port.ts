import type { Duplex, Readable } from 'node:stream'
import { CairnProblem, type FileEntry, type WorkspaceDiff } from '@cairn/protocol'
import {
  type Admission,
  type AgentInfo,
  type AgentSpec,
  type CommandResult,
  type ImageBuildContext,
  type ImageRecipe,
  type ImageRecord,
  type IsolationName,
  type PoolArea,
  type PoolQuotaStatus,
  type PoolStats,
  type RevisionBuild,
  type RevisionBuildResult,
  type RuntimeDescription,
  type RuntimePort,
  runWithOwnerEpoch,
  type SandboxDriverFacts,
  type ShippedTree,
  type TreeReadOptions,
  type TreeRef,
  type TreeSizes,
  type TurnInput,
  type TurnMessage,
  type WorkspaceCommand,
  type WorkspaceMark,
} from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { Db } from '../../db/database.js'
import { ClusterRows } from './cluster-rows.js'
import type { NodeDirectory, NodeRow } from './node-directory.js'
import { NoNodeAvailable, type PlacementNode, placeSession } from './placement.js'
import { RevisionShipping, SERVING_STATES } from './revision-shipping.js'

export interface ClusterRuntimePortOptions {
  db: Db
  directory: NodeDirectory
  logger: Logger
  /** How long a session's node and epoch, a revision's holders and the nodes' rows are reused. */
  cacheMs?: number | undefined
  /** Free pool space a node needs to take a new session (default 64 MiB). */
  minFreeBytes?: number | undefined
  /** Placement's random source (tests seed it). */
  random?: (() => number) | undefined
  now?: (() => number) | undefined
}

/** A node's port, with what is known of it: its row and, for a session, the epoch calls carry. */
interface Route {
  node: NodeRow
  port: RuntimePort
  ownerEpoch: number
}

/**
 * The runtime port of an API replica (`cairn server --role api`): no runtime of its own, every
 * call goes to a node. A call about a session goes to the node in `sessions.runtime_id`, under
 * the session's owner epoch (`runWithOwnerEpoch`: a node that has seen a newer owner refuses it);
 * a snapshot's to its session's node; a revision's to a node holding it (`revision_nodes`); a new
 * session to the node placement picks (power of two choices), its revision shipped there first;
 * a fork to its parent's node; a deploy to a placed node, recorded as the revision's holder once
 * sealed. A session whose node was declared lost is `node_lost`; one that cannot be reached,
 * `node_unavailable` (both 503, retryable).
 */
export class ClusterRuntimePort implements RuntimePort {
  readonly rows: ClusterRows
  private readonly shipping: RevisionShipping
  /** Revisions being deployed, by ID: the node they were staged on. */
  private readonly staged = new Map<string, string>()
  /** Sessions placed on a node since the heartbeat its row's figures are from. */
  private readonly placedSince = new Map<string, { heartbeatAt: string; count: number }>()

  constructor(private readonly options: ClusterRuntimePortOptions) {
    const now = options.now ?? Date.now
    this.rows = new ClusterRows(options.db, options.cacheMs ?? 1000, now)
    this.shipping = new RevisionShipping(this.rows, options.directory, options.logger)
  }

  /** The node a new session was placed on (for its row's `runtime_id`), until the row says so. */
  placedNode(sessionId: string): string | undefined {
    return this.rows.placedNode(sessionId)
  }

  // --- finding nodes ------------------------------------------------------------------------

  /** The node's port, refused as `node_lost` or `node_unavailable` when it cannot serve. */
  private async nodePort(nodeId: string): Promise<{ node: NodeRow; port: RuntimePort }> {
    const node = await this.options.directory.node(nodeId)
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

  private async sessionRoute(sessionId: string): Promise<Route> {
    const home = await this.rows.home(sessionId)
    return { ...(await this.nodePort(home.nodeId)), ownerEpoch: home.ownerEpoch }
  }

  /** Runs `call` on the session's node under its owner epoch. */
  private async onSession<T>(sessionId: string, call: (port: RuntimePort) => Promise<T>): Promise<T> {
    const route = await this.sessionRoute(sessionId)
    return runWithOwnerEpoch(route.ownerEpoch, () => call(route.port))
  }

  private async snapshotRoute(snapshotId: string): Promise<Route> {
    return this.sessionRoute(await this.rows.snapshotSession(snapshotId))
  }

  /** A node that holds the revision and serves (any of them). */
  private async revisionRoute(revisionId: string): Promise<Route> {
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

  private async stagedRoute(revisionId: string): Promise<Route> {
    const nodeId = this.staged.get(revisionId)
    if (!nodeId) throw new CairnProblem('not_found', `revision ${revisionId} is not being deployed`)
    return { ...(await this.nodePort(nodeId)), ownerEpoch: 0 }
  }

  private treeRoute(tree: TreeRef): Promise<Route> {
    if ('sessionId' in tree) return this.sessionRoute(tree.sessionId)
    if ('snapshotId' in tree) return this.snapshotRoute(tree.snapshotId)
    if ('stagedRevisionId' in tree) return this.stagedRoute(tree.stagedRevisionId)
    return this.revisionRoute(tree.revisionId)
  }

  /** Runs a read of a tree on the node that holds it (a session's trees under its epoch). */
  private async onTree<T>(tree: TreeRef, call: (port: RuntimePort) => Promise<T>): Promise<T> {
    const route = await this.treeRoute(tree)
    return runWithOwnerEpoch(route.ownerEpoch, () => call(route.port))
  }

  /** Every node that serves now (for what is asked of all: images, memory, figures). */
  private async servingNodes(): Promise<{ node: NodeRow; port: RuntimePort }[]> {
    const serving = (rows: NodeRow[]) => rows.filter((node) => SERVING_STATES.has(node.state))
    let nodes = serving(await this.options.directory.nodes())
    // None in the cached rows: a node may have registered since.
    if (nodes.length === 0) nodes = serving(await this.options.directory.nodes(true))
    return nodes.map((node) => ({ node, port: this.options.directory.port(node) }))
  }

  private async anyNode(): Promise<{ node: NodeRow; port: RuntimePort }> {
    const nodes = await this.servingNodes()
    const ready = nodes.find(({ node }) => node.state === 'ready') ?? nodes[0]
    if (!ready) throw new CairnProblem('node_unavailable', 'no runtime node is serving')
    return ready
  }

  /** Picks a node for a new session (or a deploy) by power of two choices. */
  private async place(revisionId: string | undefined): Promise<NodeRow> {
    try {
      return await this.placeOn(await this.options.directory.nodes(), revisionId)
    } catch (error) {
      // Refused on cached rows: a node may have registered or come back since.
      if (!(error instanceof CairnProblem) || error.code !== 'node_unavailable') throw error
      return this.placeOn(await this.options.directory.nodes(true), revisionId)
    }
  }

  private async placeOn(nodes: NodeRow[], revisionId: string | undefined): Promise<NodeRow> {
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

  // --- agents -------------------------------------------------------------------------------
  admitAgent(admission: Admission): Promise<() => Promise<void>> {
    return this.onSession(admission.sessionId, (port) => port.admitAgent(admission))
  }

  resumeAgent(sessionId: string): Promise<AgentInfo | undefined> {
    return this.onSession(sessionId, (port) => port.resumeAgent(sessionId))
  }

  startAgent(spec: AgentSpec): Promise<AgentInfo> {
    return this.onSession(spec.sessionId, (port) => port.startAgent(spec))
  }

  agent(sessionId: string): Promise<AgentInfo | undefined> {
    return this.onSession(sessionId, (port) => port.agent(sessionId))
  }

  async *runTurn(sessionId: string, input: TurnInput): AsyncIterable<TurnMessage> {
    const route = await this.sessionRoute(sessionId)
    // Each step runs under the epoch: a remote port may open its stream on the first `next`.
    const iterator = runWithOwnerEpoch(route.ownerEpoch, () =>
      route.port.runTurn(sessionId, input)[Symbol.asyncIterator](),
    )
    let done = false
    try {
      while (true) {
        const step = await runWithOwnerEpoch(route.ownerEpoch, () => iterator.next())
        if (step.done) {
          done = true
          return
        }
        yield step.value
      }
    } finally {
      // A reader that stopped early cancels the turn on the node (its stream is ended).
      if (!done) await runWithOwnerEpoch(route.ownerEpoch, async () => iterator.return?.())
    }
  }

  cancelTurn(sessionId: string, turnId: string): Promise<void> {
    return this.onSession(sessionId, (port) => port.cancelTurn(sessionId, turnId))
  }

  coolDown(sessionId: string, keepWarmMs: number): Promise<void> {
    return this.onSession(sessionId, (port) => port.coolDown(sessionId, keepWarmMs))
  }

  keepWarm(sessionId: string, ms: number, activity?: boolean): Promise<void> {
    return this.onSession(sessionId, (port) => port.keepWarm(sessionId, ms, activity))
  }

  stopAgent(sessionId: string): Promise<void> {
    return this.onSession(sessionId, (port) => port.stopAgent(sessionId))
  }

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

  listeningPorts(sessionId: string): Promise<number[]> {
    return this.onSession(sessionId, (port) => port.listeningPorts(sessionId))
  }

  connectPort(sessionId: string, tcpPort: number): Promise<Duplex> {
    return this.onSession(sessionId, (port) => port.connectPort(sessionId, tcpPort))
  }

  // --- workspaces and snapshots ---------------------------------------------------------------
  /** Places the new session, ships its revision to that node if it lacks it, makes the workspace. */
  async createWorkspace(sessionId: string, revisionId: string, tenantId: string): Promise<void> {
    const node = await this.place(revisionId)
    await this.shipping.ensure(node, revisionId)
    this.rows.notePlaced(sessionId, node.id)
    const { port } = await this.nodePort(node.id)
    await runWithOwnerEpoch(0, () => port.createWorkspace(sessionId, revisionId, tenantId))
  }

  hasWorkspace(sessionId: string): Promise<boolean> {
    return this.onSession(sessionId, (port) => port.hasWorkspace(sessionId))
  }

  deleteWorkspace(sessionId: string): Promise<void> {
    return this.onSession(sessionId, (port) => port.deleteWorkspace(sessionId))
  }

  snapshotWorkspace(
    sessionId: string,
    snapshotId: string,
    tenantId: string,
  ): Promise<WorkspaceMark | undefined> {
    this.rows.noteSnapshot(snapshotId, sessionId)
    return this.onSession(sessionId, (port) => port.snapshotWorkspace(sessionId, snapshotId, tenantId))
  }

  unchangedSince(sessionId: string, mark: WorkspaceMark): Promise<boolean> {
    return this.onSession(sessionId, (port) => port.unchangedSince(sessionId, mark))
  }

  restoreWorkspace(
    sessionId: string,
    snapshotId: string,
    generation: number,
    tenantId: string,
  ): Promise<void> {
    return this.onSession(sessionId, (port) =>
      port.restoreWorkspace(sessionId, snapshotId, generation, tenantId),
    )
  }

  /** A fork lives where its parent's snapshot is: on the parent's node. */
  async forkWorkspace(childId: string, snapshotId: string, tenantId: string): Promise<void> {
    const parent = await this.snapshotRoute(snapshotId)
    this.rows.notePlaced(childId, parent.node.id)
    await runWithOwnerEpoch(0, () => parent.port.forkWorkspace(childId, snapshotId, tenantId))
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    const route = await this.snapshotRoute(snapshotId)
    await runWithOwnerEpoch(route.ownerEpoch, () => route.port.deleteSnapshot(snapshotId))
  }

  async hasSnapshot(snapshotId: string): Promise<boolean> {
    const route = await this.snapshotRoute(snapshotId)
    return runWithOwnerEpoch(route.ownerEpoch, () => route.port.hasSnapshot(snapshotId))
  }

  /** Each session's generation from its own node, under its own epoch. */
  readGenerations(sessionIds: readonly string[]): Promise<(number | undefined)[]> {
    return Promise.all(
      sessionIds.map(async (id) => (await this.onSession(id, (port) => port.readGenerations([id])))[0]),
    )
  }

  writeGeneration(sessionId: string, generation: number): Promise<void> {
    return this.onSession(sessionId, (port) => port.writeGeneration(sessionId, generation))
  }

  /** The pools of every serving node, added up (a node that does not answer is left out). */
  async poolStats(): Promise<PoolStats> {
    const stats = await this.fromEveryNode((port) => port.poolStats())
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
    return (await this.anyNode()).port.quotaStatus()
  }

  /** Each tenant's trees on every node, added up. */
  async tenantUsage(tenantIds: readonly string[]): Promise<Record<string, TreeSizes>> {
    const usage: Record<string, TreeSizes> = {}
    for (const perNode of await this.fromEveryNode((port) => port.tenantUsage(tenantIds))) {
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
    const nodes = await this.servingNodes()
    const withDriver = isolation
      ? nodes.find(({ node }) => parseDrivers(node.drivers).includes(isolation))
      : undefined
    return (withDriver ?? (await this.anyNode())).port.sandboxDriver(isolation)
  }

  async describe(): Promise<RuntimeDescription> {
    return (await this.anyNode()).port.describe()
  }

  /** The names stored in that area on any serving node. */
  async listStored(area: PoolArea): Promise<string[]> {
    return [...new Set((await this.fromEveryNode((port) => port.listStored(area))).flat())]
  }

  recoverWorkspace(sessionId: string): Promise<void> {
    return this.onSession(sessionId, (port) => port.recoverWorkspace(sessionId))
  }

  async discardStaging(name: string): Promise<void> {
    await this.fromEveryNode((port) => port.discardStaging(name))
  }

  // --- reading trees --------------------------------------------------------------------------
  hasTree(tree: TreeRef): Promise<boolean> {
    return this.onTree(tree, (port) => port.hasTree(tree))
  }

  hasPath(tree: TreeRef, rel: string): Promise<boolean> {
    return this.onTree(tree, (port) => port.hasPath(tree, rel))
  }

  listFiles(tree: TreeRef, rel: Buffer, options?: TreeReadOptions): Promise<FileEntry[]> {
    return this.onTree(tree, (port) => port.listFiles(tree, rel, options))
  }

  openFile(
    tree: TreeRef,
    rel: Buffer,
    options?: TreeReadOptions,
  ): Promise<{ size: number; stream: Readable }> {
    return this.onTree(tree, (port) => port.openFile(tree, rel, options))
  }

  /** On the node of the tree that is not a revision (a session's node holds its revision too). */
  diff(from: TreeRef, to: TreeRef, fromLabel: string, options?: TreeReadOptions): Promise<WorkspaceDiff> {
    const decides = 'revisionId' in to ? from : to
    return this.onTree(decides, (port) => port.diff(from, to, fromLabel, options))
  }

  digest(tree: TreeRef, options?: TreeReadOptions): Promise<string> {
    return this.onTree(tree, (port) => port.digest(tree, options))
  }

  treeSizes(tree: TreeRef): Promise<TreeSizes> {
    return this.onTree(tree, (port) => port.treeSizes(tree))
  }

  memoryCheckpointBytes(sessionIds: readonly string[]): Promise<number[]> {
    return Promise.all(
      sessionIds.map(
        async (id) => (await this.onSession(id, (port) => port.memoryCheckpointBytes([id])))[0] ?? 0,
      ),
    )
  }

  checkpointForSnapshot(
    sessionId: string,
    snapshotId: string,
  ): Promise<{ bytes: number; checkpointMs: number }> {
    this.rows.noteSnapshot(snapshotId, sessionId)
    return this.onSession(sessionId, (port) => port.checkpointForSnapshot(sessionId, snapshotId))
  }

  /** On the snapshot's node, which is the fork's (see `forkWorkspace`), under the fork's epoch. */
  async forkMemory(snapshotId: string, childId: string, generation: number): Promise<boolean> {
    const route = await this.snapshotRoute(snapshotId)
    const child = await this.rows.home(childId)
    return runWithOwnerEpoch(child.ownerEpoch, () => route.port.forkMemory(snapshotId, childId, generation))
  }

  async expireMemoryCheckpoints(cutoff: Date): Promise<{ sessionId: string; bytes: number }[]> {
    return (await this.fromEveryNode((port) => port.expireMemoryCheckpoints(cutoff))).flat()
  }

  exportTree(tree: TreeRef): Promise<{ stream: Readable; stop: () => Promise<void> }> {
    return this.onTree(tree, (port) => port.exportTree(tree))
  }

  // --- commands in a workspace ---------------------------------------------------------------
  writeFile(sessionId: string, rel: string, body: Readable): Promise<void> {
    return this.onSession(sessionId, (port) => port.writeFile(sessionId, rel, body))
  }

  deletePath(sessionId: string, rel: string): Promise<void> {
    return this.onSession(sessionId, (port) => port.deletePath(sessionId, rel))
  }

  replaceWorkspaceWithArchive(
    sessionId: string,
    tenantId: string,
    archive: Buffer,
    generation: number,
  ): Promise<void> {
    return this.onSession(sessionId, (port) =>
      port.replaceWorkspaceWithArchive(sessionId, tenantId, archive, generation),
    )
  }

  unpackIntoWorkspace(sessionId: string, archive: Buffer): Promise<void> {
    return this.onSession(sessionId, (port) => port.unpackIntoWorkspace(sessionId, archive))
  }

  runCommand(
    command: WorkspaceCommand,
    onLine: (line: string) => void,
    signal?: AbortSignal | undefined,
  ): Promise<CommandResult> {
    return this.onSession(command.sessionId, (port) => port.runCommand(command, onLine, signal))
  }

  // --- revisions ----------------------------------------------------------------------------
  /** A deploy is staged, built and sealed on one placed node, then recorded as its holder. */
  async stageRevision(revisionId: string, tenantId: string, archive: Buffer): Promise<void> {
    const node = await this.place(undefined)
    this.staged.set(revisionId, node.id)
    try {
      await this.options.directory.port(node).stageRevision(revisionId, tenantId, archive)
    } catch (error) {
      this.staged.delete(revisionId)
      throw error
    }
  }

  async buildRevision(build: RevisionBuild, onLog: (line: string) => void): Promise<RevisionBuildResult> {
    return (await this.stagedRoute(build.revisionId)).port.buildRevision(build, onLog)
  }

  async sealRevision(revisionId: string, tenantId: string): Promise<void> {
    const route = await this.stagedRoute(revisionId)
    await route.port.sealRevision(revisionId, tenantId)
    this.staged.delete(revisionId)
    await this.rows.addRevisionHolder(revisionId, route.node.id)
  }

  async discardStagedRevision(revisionId: string): Promise<void> {
    const nodeId = this.staged.get(revisionId)
    if (!nodeId) return
    await (await this.nodePort(nodeId)).port.discardStagedRevision(revisionId)
    this.staged.delete(revisionId)
  }

  async exportPoolTree(tree: ShippedTree): Promise<Readable> {
    if ('revisionId' in tree) return (await this.revisionRoute(tree.revisionId)).port.exportPoolTree(tree)
    throw new CairnProblem('bad_request', 'a dependency environment is shipped with its revision')
  }

  async importPoolTree(_tree: ShippedTree, _tenantId: string, _stream: Readable): Promise<void> {
    throw new CairnProblem(
      'bad_request',
      'trees are shipped between nodes by the cluster, not imported into it',
    )
  }

  // --- images: every serving node holds the images its sessions may need --------------------
  async imageKeyOf(recipe: ImageRecipe, ctx: ImageBuildContext): Promise<string | undefined> {
    return (await this.anyNode()).port.imageKeyOf(recipe, ctx)
  }

  /** Built only when every serving node has it (so that a deploy builds it where it is missing). */
  async hasImage(key: string): Promise<boolean> {
    const answers = await Promise.all((await this.servingNodes()).map(({ port }) => port.hasImage(key)))
    return answers.length > 0 && answers.every(Boolean)
  }

  async ensureImage(recipe: ImageRecipe, key: string, ctx: ImageBuildContext): Promise<void> {
    const nodes = await this.servingNodes()
    if (nodes.length === 0) throw new CairnProblem('node_unavailable', 'no runtime node is serving')
    await Promise.all(nodes.map(({ port }) => port.ensureImage(recipe, key, ctx)))
  }

  async image(key: string): Promise<ImageRecord | undefined> {
    for (const record of await this.fromEveryNode((port) => port.image(key))) if (record) return record
    return undefined
  }

  /** Each image once (by key), as the first node that holds it describes it. */
  async listImages(): Promise<ImageRecord[]> {
    const byKey = new Map<string, ImageRecord>()
    for (const record of (await this.fromEveryNode((port) => port.listImages())).flat())
      if (!byKey.has(record.key)) byKey.set(record.key, record)
    return [...byKey.values()]
  }

  async removeImage(key: string): Promise<void> {
    const nodes = await this.servingNodes()
    await Promise.all(
      nodes.map(async ({ port }) => {
        if (await port.hasImage(key)) await port.removeImage(key)
      }),
    )
  }

  // --- agent memory ---------------------------------------------------------------------------
  async publishMemory(agentId: string, version: number, content: string): Promise<void> {
    const nodes = await this.servingNodes()
    await Promise.all(nodes.map(({ port }) => port.publishMemory(agentId, version, content)))
  }

  /** Asks every serving node; those that fail are logged and left out of the answer. */
  private async fromEveryNode<T>(call: (port: RuntimePort) => Promise<T>): Promise<T[]> {
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
