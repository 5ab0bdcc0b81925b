import { rmSync } from 'node:fs'
import path from 'node:path'
import { type Duplex, Readable } from 'node:stream'
import { CairnProblem, COMMAND_SIGNALS } from '@cairn/protocol'
import type { AgentProcess } from '../agent/agent-process.js'
import type { TurnInput, TurnOutcome } from '../agent/types.js'
import { type RevisionBuild, RevisionBuilder, type RevisionBuildResult } from '../build/revision-builder.js'
import type { CommandResult } from '../build/run-command.js'
import {
  type CommandRead,
  type CommandReadRequest,
  type CommandStart,
  type CommandState,
  NodeCommands,
} from '../commands/node-commands.js'
import type { EgressSite } from '../egress/proxy.js'
import { type ImageBuildContext, ImageBuilder } from '../images/image-builder.js'
import type { ImageRecipe } from '../images/image-recipe.js'
import { type ImageRecord, ImageStore } from '../images/image-store.js'
import { MemoryMounts } from '../launch/memory-mounts.js'
import { DEFAULT_SANDBOX_UID, type Runtime } from '../runtime.js'
import type { SandboxDriver } from '../sandbox/driver.js'
import { EnvStore } from '../storage/env-store.js'
import { deleteWorkspacePath, writeWorkspaceFile } from '../workspace-io/sandboxed-io.js'
import { noBucket, PortShipping, type PortShippingOptions } from './bucket-shipping.js'
import { LocalPoolPort } from './local-pool-port.js'
import { MemoryPause } from './memory-pause.js'
import { exportPoolTree, importPoolTree, type ShippedTree } from './pool-tree-shipping.js'
import { ResidentPauses } from './resident-pauses.js'
import { RevisionStaging } from './revision-staging.js'
import type {
  Admission,
  AgentInfo,
  AgentSpec,
  BucketRestore,
  ForkCheckpoint,
  NodeShippingLag,
  RuntimeEvents,
  RuntimePort,
  ShippedHead,
  SnapshotOptions,
  TerminalSize,
  TurnOptions,
  WorkspaceCommand,
  WorkspaceMark,
} from './runtime-port.js'
import { SandboxLaunches } from './sandbox-launches.js'
import { SessionUse } from './session-use.js'
import { type TurnMessage, turnStream } from './turn-stream.js'
import { type PoolClock, WarmPool } from './warm-pool.js'
import { replaceWithArchive, unpackIntoSessionWorkspace } from './workspace-archive.js'
import { snapshotFrozen, unchangedSince } from './workspace-marks.js'

export interface LocalRuntimePortOptions {
  /** The clock of the warm pool (usage order, cooldown deadlines). */
  clock: PoolClock
  /** Where pause and network events go (the server's observer); dropped without one. */
  events?: RuntimeEvents | undefined
  /**
   * The operator's egress settings (private exceptions, hosts map): every sandbox's proxy (agents,
   * setup commands, builds, image pulls) uses them.
   */
  egressSite?: EgressSite | undefined
  /** Largest image root a build or pull may leave (its staging tree is discarded beyond). */
  maxImageBytes?: number | undefined
  /** The node's shipping bucket (docs/shipping.md); without one, nothing ships. */
  shipping?: PortShippingOptions | undefined
}

/** The runtime's port served by the runtime in this process (see `RuntimePort`). */
export class LocalRuntimePort extends LocalPoolPort implements RuntimePort {
  private readonly pool: WarmPool
  /** `pause: memory` sandboxes frozen in place between keep-warm's end and their release. */
  private readonly resident: ResidentPauses
  private readonly envs: EnvStore
  private readonly images: ImageStore
  private readonly imageBuilder: ImageBuilder
  private readonly memory: MemoryMounts
  /** What uses each session's sandbox or workspace here (its cooldown waits); the turns `cancelTurn` aborts. */
  private readonly use: SessionUse
  /** Revisions being deployed: their staging trees. */
  protected readonly revisions: RevisionStaging
  /** How agents' and setup commands' sandboxes get their paths, mounts and egress. */
  private readonly launches: SandboxLaunches
  /** `pause: memory` checkpoints and snapshots' memory. */
  private readonly memoryPause: MemoryPause
  private readonly events: RuntimeEvents | undefined
  /** Shipping to the node's bucket, when it has one. */
  readonly shipping: PortShipping | undefined
  /** Commands running (and ended ones' logs) in sessions' sandboxes. */
  private readonly commands: NodeCommands

  constructor(runtime: Runtime, options: LocalRuntimePortOptions) {
    super(runtime)
    const uid = runtime.options.sandboxUid ?? DEFAULT_SANDBOX_UID
    this.events = options.events
    this.resident = new ResidentPauses(runtime.residentBounds, options.clock, runtime.logger)
    this.pool = new WarmPool(
      options.clock,
      (agent) => this.stopWithCommands(agent),
      (id) => this.use.inUse(id),
      this.resident,
    )
    const commandLogs = path.join(runtime.options.dataDir, 'command-logs')
    // Commands of an earlier process died with their sandboxes; their logs go with them.
    rmSync(commandLogs, { recursive: true, force: true })
    this.commands = new NodeCommands(commandLogs, runtime.logger, (id, keepWarmMs) => {
      if (!this.use.inUse(id)) this.pool.rest(id, keepWarmMs)
    })
    this.use = new SessionUse(
      (id) => this.commands.running(id),
      (id) => this.pool.released(id),
    )
    this.envs = new EnvStore(runtime.pool, uid)
    this.shipping = options.shipping ? new PortShipping(runtime.pool, this.envs, options.shipping) : undefined
    this.images = new ImageStore(runtime.pool)
    this.imageBuilder = new ImageBuilder({
      store: this.images,
      hostUid: uid,
      hostGid: uid,
      egressSite: options.egressSite,
      maxBytes: options.maxImageBytes,
    })
    this.revisions = new RevisionStaging(
      runtime,
      new RevisionBuilder(runtime, this.envs, this.images, uid, options.egressSite),
    )
    this.memory = new MemoryMounts(path.join(runtime.runDir, 'memory'))
    this.launches = new SandboxLaunches(runtime, {
      envs: this.envs,
      images: this.images,
      memory: this.memory,
      egressSite: options.egressSite,
      events: options.events,
    })
    this.memoryPause = new MemoryPause(runtime, this.pool, (id, event) => this.events?.pause(id, event))
  }

  private info(sessionId: string, agent: AgentProcess): AgentInfo {
    return {
      sessionId,
      sandboxId: agent.sandboxId,
      isolation: agent.isolation,
      alive: agent.alive,
      checkpointable: agent.checkpointable,
    }
  }

  private warmAgent(sessionId: string): AgentProcess {
    const agent = this.pool.agent(sessionId)
    if (!agent) throw new Error(`session ${sessionId} has no warm agent`)
    return agent
  }

  async admitAgent(admission: Admission): Promise<() => Promise<void>> {
    const busy = new Set(admission.busy)
    // The pool admits synchronously, so concurrent admissions cannot pass the cap together.
    const release = this.pool.admit(
      admission.sessionId,
      admission.tenantId,
      admission.maxSandboxesPerTenant,
      (id) => busy.has(id) || this.commands.running(id),
    )
    return async () => release()
  }

  async resumeAgent(sessionId: string): Promise<AgentInfo | undefined> {
    const warm = this.pool.take(sessionId)
    return warm ? this.info(sessionId, warm) : undefined
  }

  async startAgent(spec: AgentSpec): Promise<AgentInfo> {
    const { sessionId, tenantId, pause } = spec
    await this.pool.drop(sessionId)
    const full = await this.launches.agentLaunch(spec)
    const driver = this.runtime.driverFor(spec.isolation)
    if (!pause || !this.pausable(driver)) {
      await this.memoryPause.discard(sessionId)
      const agent = await this.runtime.startAgent(full)
      this.pool.add(sessionId, tenantId, agent)
      return this.info(sessionId, agent)
    }
    const started = await this.memoryPause.start(sessionId, full, pause.generation, driver)
    const { agent } = started
    this.pool.add(
      sessionId,
      tenantId,
      agent,
      this.memoryPause.hooks(sessionId, tenantId, agent, pause, this.resident.bounds),
    )
    return { ...this.info(sessionId, agent), restored: started.resumed }
  }

  /** `pause: memory` works under `driver` on this node: checkpoints, or resident pauses not turned off. */
  private pausable(driver: SandboxDriver): boolean {
    const { capabilities } = this.runtime.capabilitiesOf(driver)
    return capabilities.memorySnapshot || capabilities.residentPause
  }

  /** The session's warm agent, or its resident one (frozen in place: its next message only thaws it). */
  async agent(sessionId: string): Promise<AgentInfo | undefined> {
    const agent = this.pool.agent(sessionId) ?? this.pool.residentAgent(sessionId)
    return agent ? this.info(sessionId, agent) : undefined
  }

  runTurn(sessionId: string, input: TurnInput, options: TurnOptions = {}): AsyncIterable<TurnMessage> {
    let first: TurnMessage | undefined
    if (options.resume) {
      const warm = this.pool.take(sessionId)
      if (!warm) {
        // A dead agent left is stopped here (as `stopAgent`), so that the start that follows is clean.
        const dead = this.pool.agent(sessionId) !== undefined
        return turnStream(
          async () => {
            if (dead) await this.stopAgent(sessionId)
            return undefined
          },
          () => undefined,
          { type: 'cold', stopped: dead },
        )
      }
      first = { type: 'started', agent: this.info(sessionId, warm) }
    }
    const { controller, ended } = this.use.turnStarted(sessionId, input.turnId)
    return turnStream(
      async (onEvent, gate) => {
        let outcome: TurnOutcome
        try {
          outcome = await this.warmAgent(sessionId).runTurn(input, onEvent, controller.signal, gate)
        } finally {
          ended()
        }
        if (options.keepWarmMs === undefined) return { type: 'outcome', outcome }
        const agent = await this.afterTurn(sessionId, options.keepWarmMs)
        const { mark } = options
        if (!mark) return { type: 'outcome', outcome, after: { agent } }
        return {
          type: 'outcome',
          outcome,
          after: { agent, unchanged: await this.unchangedSince(sessionId, mark) },
        }
      },
      () => controller.abort(),
      first,
    )
  }

  /** The turn's sandbox after it: alive, it cools down; dead, it is stopped (`TurnOptions.keepWarmMs`). */
  private async afterTurn(sessionId: string, keepWarmMs: number): Promise<AgentInfo | undefined> {
    const agent = await this.agent(sessionId)
    if (agent?.alive) {
      await this.coolDown(sessionId, keepWarmMs)
      return agent
    }
    await this.stopAgent(sessionId)
    return undefined
  }

  async cancelTurn(sessionId: string, turnId: string): Promise<void> {
    this.use.cancelTurn(sessionId, turnId)
  }

  async coolDown(sessionId: string, keepWarmMs: number): Promise<void> {
    this.pool.coolDown(sessionId, keepWarmMs)
  }

  async keepWarm(sessionId: string, ms: number, activity = false): Promise<void> {
    this.pool.extend(sessionId, ms, activity)
  }

  async stopAgent(sessionId: string): Promise<void> {
    await this.pool.drop(sessionId)
    // What drops a session's sandbox (an end, a delete, a workspace restore, a setup phase) ends
    // its memory too.
    await this.memoryPause.discard(sessionId)
  }

  stopAllAgents(): Promise<void> {
    return this.pool.dropAll()
  }

  checkpointForSnapshot(
    sessionId: string,
    snapshotId: string,
  ): Promise<{ bytes: number; checkpointMs: number }> {
    return this.use.using(sessionId, () => this.memoryPause.checkpointWarm(sessionId, snapshotId))
  }

  checkpointForFork(sessionId: string): Promise<ForkCheckpoint> {
    return this.use.using(sessionId, () => this.memoryPause.checkpointForFork(sessionId))
  }

  keepSnapshotMemory(sessionId: string, snapshotId: string, tenantId: string): Promise<void> {
    return this.use.using(sessionId, () =>
      this.memoryPause.keepSnapshotMemory(sessionId, snapshotId, tenantId),
    )
  }

  async exportMemory(sessionId: string): Promise<{ stream: Readable; stop: () => Promise<void> }> {
    const packed = await this.use.using(sessionId, () => this.memoryPause.exportMemory(sessionId))
    if (!packed)
      throw new CairnProblem('sandbox_not_running', `session ${sessionId} has no memory checkpoint here`)
    return { stream: Readable.from([packed]), stop: async () => {} }
  }

  importMemory(sessionId: string, archive: Buffer, generation: number): Promise<void> {
    return this.use.using(sessionId, () => this.memoryPause.importMemory(sessionId, archive, generation))
  }

  forkMemory(snapshotId: string, childId: string, generation: number): Promise<boolean> {
    return this.memoryPause.fork(snapshotId, childId, generation)
  }

  memoryCheckpointBytes(sessionIds: readonly string[]): Promise<number[]> {
    return this.memoryPause.bytes(sessionIds)
  }

  expireMemoryCheckpoints(cutoff: Date): Promise<{ sessionId: string; bytes: number }[]> {
    return this.memoryPause.expire(cutoff)
  }

  async warmCount(): Promise<number> {
    return this.pool.size
  }

  async listeningPorts(sessionId: string): Promise<number[]> {
    return (await this.pool.agent(sessionId)?.listeningPorts()) ?? []
  }

  connectPort(sessionId: string, port: number): Promise<Duplex> {
    return this.warmAgent(sessionId).connectPort(port)
  }

  async deleteWorkspace(sessionId: string): Promise<void> {
    await this.commands.forget(sessionId)
    await this.runtime.pool.deleteWorkspace(sessionId)
  }

  async snapshotWorkspace(
    sessionId: string,
    snapshotId: string,
    tenantId: string,
    options?: SnapshotOptions,
  ): Promise<WorkspaceMark | undefined> {
    const mark = await this.use.using(sessionId, () =>
      snapshotFrozen(this.runtime.pool, this.pool.agent(sessionId), sessionId, snapshotId, tenantId),
    )
    if (options?.ship) this.shipping?.enqueue(sessionId, snapshotId)
    return mark
  }

  /** See `unchangedSince` (workspace-marks.ts). */
  unchangedSince(sessionId: string, mark: WorkspaceMark): Promise<boolean> {
    return unchangedSince(this.runtime.pool, this.pool.agent(sessionId), sessionId, mark)
  }

  restoreWorkspace(
    sessionId: string,
    snapshotId: string,
    generation: number,
    tenantId: string,
  ): Promise<void> {
    return this.use.using(sessionId, () =>
      this.runtime.pool.restoreWorkspace(sessionId, snapshotId, generation, tenantId),
    )
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.runtime.pool.deleteSnapshot(snapshotId)
    await this.memoryPause.discardSnapshot(snapshotId)
  }

  /** Stops an agent's sandbox; the commands running in it end with it (their cause says so). */
  private async stopWithCommands(agent: AgentProcess): Promise<void> {
    const ending = this.commands.sandboxStopping(agent.sessionId)
    await this.runtime.stopAgent(agent)
    await ending
  }

  startCommand(start: CommandStart): Promise<CommandState> {
    return this.use.using(start.sessionId, async () => {
      const agent = this.pool.agent(start.sessionId)
      if (!agent?.alive)
        throw new CairnProblem('sandbox_not_running', `session ${start.sessionId} has no running sandbox`)
      return this.commands.start(agent, start)
    })
  }

  readCommand(request: CommandReadRequest): Promise<CommandRead> {
    return this.commands.read(request)
  }

  writeCommandInput(
    sessionId: string,
    commandId: string,
    data: Uint8Array,
    close: boolean,
  ): Promise<CommandState> {
    return this.commands.writeInput(sessionId, commandId, data, close)
  }

  async signalCommand(sessionId: string, commandId: string, signal: string): Promise<CommandState> {
    if (!(COMMAND_SIGNALS as readonly string[]).includes(signal))
      throw new CairnProblem('bad_request', `signal ${signal} cannot be sent to a command`)
    return this.commands.signal(sessionId, commandId, signal as NodeJS.Signals)
  }

  async resizeCommand(sessionId: string, commandId: string, size: TerminalSize): Promise<CommandState> {
    return this.commands.resize(sessionId, commandId, size.rows, size.cols)
  }

  writeFile(sessionId: string, rel: string, body: Readable): Promise<void> {
    return this.use.using(sessionId, () =>
      writeWorkspaceFile(this.runtime, this.runtime.pool.workspacePath(sessionId), rel, body),
    )
  }

  deletePath(sessionId: string, rel: string): Promise<void> {
    return this.use.using(sessionId, () =>
      deleteWorkspacePath(this.runtime, this.runtime.pool.workspacePath(sessionId), rel),
    )
  }

  replaceWorkspaceWithArchive(
    sessionId: string,
    tenantId: string,
    archive: Buffer,
    generation: number,
  ): Promise<void> {
    return this.use.using(sessionId, () =>
      replaceWithArchive(this.runtime, sessionId, tenantId, archive, generation),
    )
  }

  unpackIntoWorkspace(sessionId: string, archive: Buffer): Promise<void> {
    return this.use.using(sessionId, () => unpackIntoSessionWorkspace(this.runtime, sessionId, archive))
  }

  /** In a fresh sandbox with its own run dir (an empty transcript), removed when it is done. */
  runCommand(
    command: WorkspaceCommand,
    onLine: (line: string) => void,
    signal?: AbortSignal | undefined,
  ): Promise<CommandResult> {
    return this.use.using(command.sessionId, () => this.launches.runCommand(command, onLine, signal))
  }

  stageRevision(revisionId: string, tenantId: string, archive: Buffer): Promise<void> {
    return this.revisions.stage(revisionId, tenantId, archive)
  }

  buildRevision(build: RevisionBuild, onLog: (line: string) => void): Promise<RevisionBuildResult> {
    return this.revisions.build(build, onLog)
  }

  sealRevision(revisionId: string, tenantId: string): Promise<void> {
    return this.revisions.seal(revisionId, tenantId)
  }

  discardStagedRevision(revisionId: string): Promise<void> {
    return this.revisions.discard(revisionId)
  }

  exportPoolTree(tree: ShippedTree): Promise<Readable> {
    return exportPoolTree(this.runtime.pool, this.envs, tree)
  }

  importPoolTree(tree: ShippedTree, tenantId: string, stream: Readable): Promise<void> {
    return importPoolTree(this.runtime.pool, this.envs, tree, tenantId, stream)
  }

  restoreFromBucket(sessionId: string, tenantId: string, expected: ShippedHead): Promise<BucketRestore> {
    const shipping = this.shipping
    if (!shipping) return Promise.reject(noBucket())
    return this.use.using(sessionId, () => shipping.restore(sessionId, tenantId, expected))
  }

  async shipPoolTree(tree: ShippedTree): Promise<{ shipped: boolean }> {
    if (!this.shipping) throw noBucket()
    return this.shipping.shipTree(tree)
  }

  async fetchPoolTree(tree: ShippedTree, tenantId: string): Promise<void> {
    if (!this.shipping) throw noBucket()
    await this.shipping.fetchTree(tree, tenantId)
  }

  async shippingLag(): Promise<NodeShippingLag> {
    return (
      this.shipping?.lag() ?? { enabled: false, unshippedSnapshots: 0, secondsBehind: 0, failingSessions: 0 }
    )
  }

  /** Stops shipping (what is not shipped yet stays unshipped); the composition root calls it on close. */
  async closeShipping(): Promise<void> {
    await this.shipping?.close()
  }

  imageKeyOf(recipe: ImageRecipe, ctx: ImageBuildContext): Promise<string | undefined> {
    return this.imageBuilder.keyOf(recipe, ctx)
  }

  async hasImage(key: string): Promise<boolean> {
    return this.images.has(key)
  }

  async ensureImage(recipe: ImageRecipe, key: string, ctx: ImageBuildContext): Promise<void> {
    await this.imageBuilder.ensure(recipe, key, ctx)
  }

  image(key: string): Promise<ImageRecord | undefined> {
    return this.images.get(key)
  }

  listImages(): Promise<ImageRecord[]> {
    return this.images.list()
  }

  removeImage(key: string): Promise<void> {
    return this.images.remove(key)
  }

  publishMemory(agentId: string, version: number, content: string): Promise<void> {
    return this.memory.publish(agentId, version, content)
  }
}
