import type { Duplex, Readable } from 'node:stream'
import { CairnProblem, type FileEntry, type WorkspaceDiff } from '@cairn/protocol'
import {
  type Admission,
  type AgentInfo,
  type AgentSpec,
  type BucketRestore,
  type CommandRead,
  type CommandReadRequest,
  type CommandResult,
  type CommandStart,
  type CommandState,
  type ForkCheckpoint,
  type RevisionBuild,
  type RevisionBuildResult,
  type RuntimePort,
  runWithOwnerEpoch,
  type ShippedHead,
  type ShippedTree,
  type SnapshotOptions,
  type TerminalSize,
  type TreeReadOptions,
  type TreeRef,
  type TreeSizes,
  type TurnInput,
  type TurnMessage,
  type TurnOptions,
  type WorkspaceCommand,
  type WorkspaceMark,
} from '@cairn/runtime/port'
import { ClusterFanOut } from './cluster-fan-out.js'
import { ClusterRoutes, type Route } from './cluster-routes.js'
import { ClusterRows } from './cluster-rows.js'
import type { ClusterRuntimePortOptions } from './cluster-runtime-port-options.js'
import type { NodeRow } from './node-directory.js'
import { NodeLossRecovery } from './node-loss-recovery.js'
import { RevisionShipping, shipSealed } from './revision-shipping.js'

export type { ClusterRuntimePortOptions } from './cluster-runtime-port-options.js'

/** The leader's check interval and slack: a dead node is declared lost within its lease and this. */
const LEADER_NOTICE_MS = 2000

/** A turn's stream opened on a node, with its first message. */
interface OpenedTurn {
  iterator: AsyncIterator<TurnMessage>
  first: IteratorResult<TurnMessage>
}

/**
 * The runtime port of an API replica (`cairn server --role api`): no runtime of its own, every
 * call goes to a node. A call about a session goes to the node in `sessions.runtime_id`, under
 * the session's owner epoch (`runWithOwnerEpoch`: a node that has seen a newer owner refuses it);
 * a snapshot's to its session's node; a revision's to a node holding it (`revision_nodes`); a new
 * session to the node placement picks (power of two choices), its revision shipped there first;
 * a fork to its parent's node; a deploy to a placed node, recorded as the revision's holder once
 * sealed. A session whose node was declared lost is `node_lost`; one that cannot be reached,
 * `node_unavailable` (both 503, retryable). The calls about no one session (every node's figures,
 * images, agents' memory) are its base's, `ClusterFanOut`.
 */
export class ClusterRuntimePort extends ClusterFanOut implements RuntimePort {
  readonly rows: ClusterRows
  private readonly shipping: RevisionShipping
  protected readonly routes: ClusterRoutes

  constructor(options: ClusterRuntimePortOptions) {
    super(options)
    const now = options.now ?? Date.now
    this.rows = new ClusterRows(options.db, options.cacheMs ?? 1000, now)
    this.shipping = new RevisionShipping(this.rows, options.directory, options.logger)
    this.routes = new ClusterRoutes(options, this.rows)
    this.recovery = new NodeLossRecovery({
      db: options.db,
      directory: options.directory,
      rows: this.rows,
      routes: this.routes,
      shipping: this.shipping,
      logger: options.logger.child({ component: 'node-loss-recovery' }),
      faultAt: options.recoveryFaultAt,
    })
    if (options.recoverLost !== 'never') this.routes.recovery = this.recovery
  }

  /** Brings lost nodes' sessions back from the shipping bucket (see `NodeLossRecovery`). */
  readonly recovery: NodeLossRecovery

  /** How long a turn whose node broke its stream waits for the leader's verdict (`SessionRouting`). */
  get nodeVerdictMs(): number {
    return (this.options.leaseMs ?? 5000) + LEADER_NOTICE_MS
  }

  // --- moves (see SessionMover) --------------------------------------------------------------
  /**
   * A node's port, refused as `node_lost` / `node_unavailable` when it cannot serve; `fresh`: its
   * row read now (an operator's cordon a moment ago counts).
   */
  async nodePort(nodeId: string, fresh = false): Promise<{ node: NodeRow; port: RuntimePort }> {
    if (fresh) await this.options.directory.nodes(true)
    return this.routes.nodePort(nodeId)
  }

  /** Where placement would put a session of the revision, leaving out the node it leaves. */
  async placeMove(revisionId: string, fromNode: string): Promise<{ node: NodeRow; port: RuntimePort }> {
    const others = async (fresh: boolean) =>
      (await this.options.directory.nodes(fresh)).filter((node) => node.id !== fromNode)
    // Read now: a move must not land on a node cordoned a moment ago.
    const node = await this.routes.placeOn(await others(true), revisionId)
    return this.routes.nodePort(node.id)
  }

  /** Ships the revision (and its dependency environment) to the node unless it holds it. */
  ensureRevisionOn(node: NodeRow, revisionId: string): Promise<void> {
    return this.shipping.ensure(node, revisionId)
  }

  /** Forgets the session's cached node and epoch (it moved: the next call reads them again). */
  forgetHome(sessionId: string): void {
    this.rows.forget(sessionId)
  }

  /** The node a new session was placed on (for its row's `runtime_id`), until the row says so. */
  placedNode(sessionId: string): string | undefined {
    return this.rows.placedNode(sessionId)
  }

  // --- agents -------------------------------------------------------------------------------
  admitAgent(admission: Admission): Promise<() => Promise<void>> {
    return this.routes.onSession(admission.sessionId, (port) => port.admitAgent(admission))
  }

  resumeAgent(sessionId: string): Promise<AgentInfo | undefined> {
    return this.routes.onSession(sessionId, (port) => port.resumeAgent(sessionId))
  }

  startAgent(spec: AgentSpec): Promise<AgentInfo> {
    return this.routes.onSession(spec.sessionId, (port) => port.startAgent(spec))
  }

  agent(sessionId: string): Promise<AgentInfo | undefined> {
    // Asking whether it is warm never moves a session: a lost node's sessions have no agent.
    return this.routes
      .onSession(sessionId, (port) => port.agent(sessionId), { recover: false })
      .catch((error: unknown) => {
        if (this.recovery && error instanceof CairnProblem && error.code === 'node_lost') return undefined
        throw error
      })
  }

  /**
   * The turn on the session's node, under its owner epoch. A node that refuses the epoch
   * (`stale_epoch`: the session moved or was recovered since this replica read its row, and the
   * node has heard of it) ran nothing: the row is read again and the turn opened once more on the
   * session's node now; refused again under an epoch no newer, the turn fails `stale_epoch`.
   */
  async *runTurn(sessionId: string, input: TurnInput, options?: TurnOptions): AsyncIterable<TurnMessage> {
    let route = await this.routes.sessionRoute(sessionId)
    let opened: OpenedTurn
    try {
      opened = await this.openTurn(route, sessionId, input, options)
    } catch (error) {
      if (!(error instanceof CairnProblem) || error.code !== 'stale_epoch') throw error
      this.rows.forget(sessionId)
      const fresh = await this.routes.sessionRoute(sessionId)
      if (fresh.ownerEpoch <= route.ownerEpoch) throw error
      route = fresh
      opened = await this.openTurn(route, sessionId, input, options)
    }
    const { iterator } = opened
    let step = opened.first
    let done = step.done === true
    try {
      while (!step.done) {
        yield step.value
        step = await this.nextStep(route, iterator).catch((error: unknown) => {
          done = true
          throw error
        })
      }
      done = true
    } finally {
      // A reader that stopped early cancels the turn on the node (its stream is ended).
      if (!done) await runWithOwnerEpoch(route.ownerEpoch, async () => iterator.return?.())
    }
  }

  /** Opens the turn's stream on the route's node: its first message (a remote port opens it there). */
  private async openTurn(
    route: Route,
    sessionId: string,
    input: TurnInput,
    options: TurnOptions | undefined,
  ): Promise<OpenedTurn> {
    // Each step runs under the epoch: a remote port may open its stream on the first `next`.
    const iterator = runWithOwnerEpoch(route.ownerEpoch, () =>
      route.port.runTurn(sessionId, input, options)[Symbol.asyncIterator](),
    )
    return { iterator, first: await this.nextStep(route, iterator) }
  }

  private async nextStep(
    route: Route,
    iterator: AsyncIterator<TurnMessage>,
  ): Promise<IteratorResult<TurnMessage>> {
    try {
      return await runWithOwnerEpoch(route.ownerEpoch, () => iterator.next())
    } catch (error) {
      throw await this.routes.explain(error, route.node.id)
    }
  }

  cancelTurn(sessionId: string, turnId: string): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.cancelTurn(sessionId, turnId))
  }

  coolDown(sessionId: string, keepWarmMs: number): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.coolDown(sessionId, keepWarmMs))
  }

  keepWarm(sessionId: string, ms: number, activity?: boolean): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.keepWarm(sessionId, ms, activity))
  }

  stopAgent(sessionId: string): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.stopAgent(sessionId))
  }

  listeningPorts(sessionId: string): Promise<number[]> {
    return this.routes.onSession(sessionId, (port) => port.listeningPorts(sessionId))
  }

  connectPort(sessionId: string, tcpPort: number): Promise<Duplex> {
    return this.routes.onSession(sessionId, (port) => port.connectPort(sessionId, tcpPort))
  }

  // --- workspaces and snapshots ---------------------------------------------------------------
  /** Places the new session, ships its revision to that node if it lacks it, makes the workspace. */
  async createWorkspace(sessionId: string, revisionId: string, tenantId: string): Promise<void> {
    const node = await this.routes.place(revisionId)
    await this.shipping.ensure(node, revisionId)
    this.rows.notePlaced(sessionId, node.id)
    const { port } = await this.routes.nodePort(node.id)
    await runWithOwnerEpoch(0, () => port.createWorkspace(sessionId, revisionId, tenantId))
  }

  hasWorkspace(sessionId: string): Promise<boolean> {
    return this.routes.onSession(sessionId, (port) => port.hasWorkspace(sessionId))
  }

  deleteWorkspace(sessionId: string): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.deleteWorkspace(sessionId))
  }

  snapshotWorkspace(
    sessionId: string,
    snapshotId: string,
    tenantId: string,
    options?: SnapshotOptions,
  ): Promise<WorkspaceMark | undefined> {
    this.rows.noteSnapshot(snapshotId, sessionId)
    return this.routes.onSession(sessionId, (port) =>
      port.snapshotWorkspace(sessionId, snapshotId, tenantId, options),
    )
  }

  unchangedSince(sessionId: string, mark: WorkspaceMark): Promise<boolean> {
    return this.routes.onSession(sessionId, (port) => port.unchangedSince(sessionId, mark))
  }

  restoreWorkspace(
    sessionId: string,
    snapshotId: string,
    generation: number,
    tenantId: string,
  ): Promise<void> {
    return this.routes.onSession(sessionId, (port) =>
      port.restoreWorkspace(sessionId, snapshotId, generation, tenantId),
    )
  }

  /** A fork lives where its parent's snapshot is: on the parent's node. */
  async forkWorkspace(childId: string, snapshotId: string, tenantId: string): Promise<void> {
    const parent = await this.routes.snapshotRoute(snapshotId)
    this.rows.notePlaced(childId, parent.node.id)
    await runWithOwnerEpoch(0, () => parent.port.forkWorkspace(childId, snapshotId, tenantId))
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    const route = await this.routes.snapshotRoute(snapshotId)
    await runWithOwnerEpoch(route.ownerEpoch, () => route.port.deleteSnapshot(snapshotId))
  }

  async hasSnapshot(snapshotId: string): Promise<boolean> {
    const route = await this.routes.snapshotRoute(snapshotId)
    return runWithOwnerEpoch(route.ownerEpoch, () => route.port.hasSnapshot(snapshotId))
  }

  /** Each session's generation from its own node, under its own epoch. */
  readGenerations(sessionIds: readonly string[]): Promise<(number | undefined)[]> {
    return Promise.all(
      sessionIds.map(
        async (id) => (await this.routes.onSession(id, (port) => port.readGenerations([id])))[0],
      ),
    )
  }

  writeGeneration(sessionId: string, generation: number): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.writeGeneration(sessionId, generation))
  }

  recoverWorkspace(sessionId: string): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.recoverWorkspace(sessionId))
  }

  hasTree(tree: TreeRef): Promise<boolean> {
    return this.routes.onTree(tree, (port) => port.hasTree(tree))
  }

  hasPath(tree: TreeRef, rel: string): Promise<boolean> {
    return this.routes.onTree(tree, (port) => port.hasPath(tree, rel))
  }

  listFiles(tree: TreeRef, rel: Buffer, options?: TreeReadOptions): Promise<FileEntry[]> {
    return this.routes.onTree(tree, (port) => port.listFiles(tree, rel, options))
  }

  openFile(
    tree: TreeRef,
    rel: Buffer,
    options?: TreeReadOptions,
  ): Promise<{ size: number; stream: Readable }> {
    return this.routes.onTree(tree, (port) => port.openFile(tree, rel, options))
  }

  /** On the node of the tree that is not a revision (a session's node holds its revision too). */
  diff(from: TreeRef, to: TreeRef, fromLabel: string, options?: TreeReadOptions): Promise<WorkspaceDiff> {
    const decides = 'revisionId' in to ? from : to
    return this.routes.onTree(decides, (port) => port.diff(from, to, fromLabel, options))
  }

  digest(tree: TreeRef, options?: TreeReadOptions): Promise<string> {
    return this.routes.onTree(tree, (port) => port.digest(tree, options))
  }

  treeSizes(tree: TreeRef): Promise<TreeSizes> {
    return this.routes.onTree(tree, (port) => port.treeSizes(tree))
  }

  memoryCheckpointBytes(sessionIds: readonly string[]): Promise<number[]> {
    return Promise.all(
      sessionIds.map(
        async (id) => (await this.routes.onSession(id, (port) => port.memoryCheckpointBytes([id])))[0] ?? 0,
      ),
    )
  }

  checkpointForSnapshot(
    sessionId: string,
    snapshotId: string,
  ): Promise<{ bytes: number; checkpointMs: number }> {
    this.rows.noteSnapshot(snapshotId, sessionId)
    return this.routes.onSession(sessionId, (port) => port.checkpointForSnapshot(sessionId, snapshotId))
  }

  checkpointForFork(sessionId: string): Promise<ForkCheckpoint> {
    return this.routes.onSession(sessionId, (port) => port.checkpointForFork(sessionId))
  }

  keepSnapshotMemory(sessionId: string, snapshotId: string, tenantId: string): Promise<void> {
    this.rows.noteSnapshot(snapshotId, sessionId)
    return this.routes.onSession(sessionId, (port) =>
      port.keepSnapshotMemory(sessionId, snapshotId, tenantId),
    )
  }

  exportMemory(sessionId: string): Promise<{ stream: Readable; stop: () => Promise<void> }> {
    return this.routes.onSession(sessionId, (port) => port.exportMemory(sessionId))
  }

  importMemory(sessionId: string, archive: Buffer, generation: number): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.importMemory(sessionId, archive, generation))
  }

  /** On the snapshot's node, which is the fork's (see `forkWorkspace`), under the fork's epoch. */
  async forkMemory(snapshotId: string, childId: string, generation: number): Promise<boolean> {
    const route = await this.routes.snapshotRoute(snapshotId)
    const child = await this.rows.home(childId)
    return runWithOwnerEpoch(child.ownerEpoch, () => route.port.forkMemory(snapshotId, childId, generation))
  }

  exportTree(tree: TreeRef): Promise<{ stream: Readable; stop: () => Promise<void> }> {
    return this.routes.onTree(tree, (port) => port.exportTree(tree))
  }

  // --- commands in a workspace ---------------------------------------------------------------
  writeFile(sessionId: string, rel: string, body: Readable): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.writeFile(sessionId, rel, body))
  }

  deletePath(sessionId: string, rel: string): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.deletePath(sessionId, rel))
  }

  replaceWorkspaceWithArchive(
    sessionId: string,
    tenantId: string,
    archive: Buffer,
    generation: number,
  ): Promise<void> {
    return this.routes.onSession(sessionId, (port) =>
      port.replaceWorkspaceWithArchive(sessionId, tenantId, archive, generation),
    )
  }

  unpackIntoWorkspace(sessionId: string, archive: Buffer): Promise<void> {
    return this.routes.onSession(sessionId, (port) => port.unpackIntoWorkspace(sessionId, archive))
  }

  runCommand(
    command: WorkspaceCommand,
    onLine: (line: string) => void,
    signal?: AbortSignal | undefined,
  ): Promise<CommandResult> {
    return this.routes.onSession(command.sessionId, (port) => port.runCommand(command, onLine, signal))
  }

  // --- commands beside the agent --------------------------------------------------------------
  startCommand(start: CommandStart): Promise<CommandState> {
    return this.routes.onSession(start.sessionId, (port) => port.startCommand(start))
  }

  readCommand(request: CommandReadRequest): Promise<CommandRead> {
    return this.routes.onSession(request.sessionId, (port) => port.readCommand(request))
  }

  writeCommandInput(
    sessionId: string,
    commandId: string,
    data: Uint8Array,
    close: boolean,
  ): Promise<CommandState> {
    return this.routes.onSession(sessionId, (port) =>
      port.writeCommandInput(sessionId, commandId, data, close),
    )
  }

  resizeCommand(sessionId: string, commandId: string, size: TerminalSize): Promise<CommandState> {
    return this.routes.onSession(sessionId, (port) => port.resizeCommand(sessionId, commandId, size))
  }

  signalCommand(sessionId: string, commandId: string, signal: string): Promise<CommandState> {
    return this.routes.onSession(sessionId, (port) => port.signalCommand(sessionId, commandId, signal))
  }

  // --- revisions ----------------------------------------------------------------------------
  /** A deploy is staged, built and sealed on one placed node, then recorded as its holder. */
  async stageRevision(revisionId: string, tenantId: string, archive: Buffer): Promise<void> {
    const node = await this.routes.place(undefined)
    this.routes.staged.set(revisionId, node.id)
    try {
      await this.options.directory.port(node).stageRevision(revisionId, tenantId, archive)
    } catch (error) {
      this.routes.staged.delete(revisionId)
      throw error
    }
  }

  async buildRevision(build: RevisionBuild, onLog: (line: string) => void): Promise<RevisionBuildResult> {
    return (await this.routes.stagedRoute(build.revisionId)).port.buildRevision(build, onLog)
  }

  async sealRevision(revisionId: string, tenantId: string): Promise<void> {
    const route = await this.routes.stagedRoute(revisionId)
    await route.port.sealRevision(revisionId, tenantId)
    this.routes.staged.delete(revisionId)
    await this.rows.addRevisionHolder(revisionId, route.node.id)
    const facts = await this.rows.revisionFacts(revisionId).catch(() => undefined)
    shipSealed(route.port, revisionId, facts?.envKey, this.options.logger)
  }

  async discardStagedRevision(revisionId: string): Promise<void> {
    const nodeId = this.routes.staged.get(revisionId)
    if (!nodeId) return
    await (await this.routes.nodePort(nodeId)).port.discardStagedRevision(revisionId)
    this.routes.staged.delete(revisionId)
  }

  async exportPoolTree(tree: ShippedTree): Promise<Readable> {
    if ('revisionId' in tree)
      return (await this.routes.revisionRoute(tree.revisionId)).port.exportPoolTree(tree)
    throw new CairnProblem('bad_request', 'a dependency environment is shipped with its revision')
  }

  async importPoolTree(_tree: ShippedTree, _tenantId: string, _stream: Readable): Promise<void> {
    throw new CairnProblem(
      'bad_request',
      'trees are shipped between nodes by the cluster, not imported into it',
    )
  }

  /** On the session's node (a lost node's session is recovered by `NodeLossRecovery` instead). */
  restoreFromBucket(sessionId: string, tenantId: string, expected: ShippedHead): Promise<BucketRestore> {
    return this.routes.onSession(sessionId, (port) => port.restoreFromBucket(sessionId, tenantId, expected))
  }

  async shipPoolTree(tree: ShippedTree): Promise<{ shipped: boolean }> {
    if ('revisionId' in tree)
      return (await this.routes.revisionRoute(tree.revisionId)).port.shipPoolTree(tree)
    throw new CairnProblem('bad_request', 'a dependency environment is shipped with its revision')
  }

  async fetchPoolTree(_tree: ShippedTree, _tenantId: string): Promise<void> {
    throw new CairnProblem('bad_request', 'a node fetches trees from the bucket, not the cluster')
  }
}
