import { existsSync, rmSync } from 'node:fs'
import { chmod, mkdir, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import type { Duplex, Readable } from 'node:stream'
import { CairnProblem, COMMAND_SIGNALS, type FileEntry, type WorkspaceDiff } from '@cairn/protocol'
import type { AgentProcess } from '../agent/agent-process.js'
import type { AgentLaunch, TurnInput, TurnOutcome } from '../agent/types.js'
import { extractArchive } from '../build/extract-archive.js'
import { type RevisionBuild, RevisionBuilder, type RevisionBuildResult } from '../build/revision-builder.js'
import { type CommandResult, runSandboxedCommand } from '../build/run-command.js'
import { checkpointOverQuota } from '../checkpoint/checkpoint-quota.js'
import { MemoryCheckpoints, startFromCheckpoint } from '../checkpoint/memory-checkpoints.js'
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
import { launchEnvironment } from '../launch/launch-env.js'
import { MemoryMounts } from '../launch/memory-mounts.js'
import { persistLaunch } from '../launch/persist-mounts.js'
import { DEFAULT_SANDBOX_UID, type Runtime } from '../runtime.js'
import type { IsolationName } from '../sandbox/driver.js'
import { EnvStore } from '../storage/env-store.js'
import type { PoolArea, PoolQuotaStatus, PoolStats, TreeSizes } from '../storage/pool.js'
import { treeDigest } from '../workspace-io/digest.js'
import { exportTree } from '../workspace-io/export-tree.js'
import { openTreeFile } from '../workspace-io/reader.js'
import { deleteWorkspacePath, unpackIntoWorkspace, writeWorkspaceFile } from '../workspace-io/sandboxed-io.js'
import { diffTrees, listDirectory, pathExists } from '../workspace-io/tree.js'
import { noBucket, PortShipping, type PortShippingOptions } from './bucket-shipping.js'
import { exportPoolTree, importPoolTree, type ShippedTree } from './pool-tree-shipping.js'
import type {
  Admission,
  AgentInfo,
  AgentSpec,
  BucketRestore,
  NodeShippingLag,
  PauseEvent,
  RuntimeDescription,
  RuntimeEvents,
  RuntimePort,
  SandboxDriverFacts,
  ShippedHead,
  SnapshotOptions,
  TerminalSize,
  TreeReadOptions,
  TreeRef,
  TurnOptions,
  WorkspaceCommand,
  WorkspaceMark,
} from './runtime-port.js'
import { type TurnMessage, turnStream } from './turn-stream.js'
import { type PoolClock, WarmPool } from './warm-pool.js'

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

const turnKey = (sessionId: string, turnId: string) => `${sessionId}/${turnId}`
/**
 * How long a cancel of a turn not running here yet is remembered: the turn may still be on its
 * way (its sandbox starting, or the call not arrived) and then starts cancelled.
 */
const EARLY_CANCEL_KEEP_MS = 10 * 60 * 1000

/** The runtime's port served by the runtime in this process (see `RuntimePort`). */
export class LocalRuntimePort implements RuntimePort {
  private readonly pool: WarmPool
  private readonly envs: EnvStore
  private readonly images: ImageStore
  private readonly imageBuilder: ImageBuilder
  private readonly revisionBuilder: RevisionBuilder
  private readonly memory: MemoryMounts
  /** Turns running, by `turnKey`: what `cancelTurn` aborts. */
  private readonly turns = new Map<string, AbortController>()
  /** Cancels of turns that were not running yet, by `turnKey`: when each is forgotten (ms). */
  private readonly earlyCancels = new Map<string, number>()
  /** Staging trees of revisions being deployed, by revision ID. */
  private readonly staged = new Map<string, string>()
  /** Calls under way that use a session's sandbox or workspace, by session: its cooldown waits. */
  private readonly calls = new Map<string, number>()
  private readonly events: RuntimeEvents | undefined
  private readonly egressSite: EgressSite | undefined
  /** Shipping to the node's bucket, when it has one. */
  readonly shipping: PortShipping | undefined
  /** Commands running (and ended ones' logs) in sessions' sandboxes. */
  private readonly commands: NodeCommands

  constructor(
    private readonly runtime: Runtime,
    options: LocalRuntimePortOptions,
  ) {
    const uid = runtime.options.sandboxUid ?? DEFAULT_SANDBOX_UID
    this.events = options.events
    this.egressSite = options.egressSite
    this.pool = new WarmPool(
      options.clock,
      (agent) => this.stopWithCommands(agent),
      (id) => this.inUse(id),
    )
    const commandLogs = path.join(runtime.options.dataDir, 'command-logs')
    // Commands of an earlier process died with their sandboxes; their logs go with them.
    rmSync(commandLogs, { recursive: true, force: true })
    this.commands = new NodeCommands(commandLogs, runtime.logger, (id, keepWarmMs) => {
      if (!this.inUse(id)) this.pool.rest(id, keepWarmMs)
    })
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
    this.revisionBuilder = new RevisionBuilder(runtime, this.envs, this.images, uid, options.egressSite)
    this.memory = new MemoryMounts(path.join(runtime.runDir, 'memory'))
    this.checkpoints = new MemoryCheckpoints(path.join(runtime.options.dataDir, 'checkpoints'))
    this.snapshotMemory = new MemoryCheckpoints(path.join(runtime.options.dataDir, 'snapshot-checkpoints'))
  }

  /** The memory of snapshots taken with `memory: true`, by snapshot ID (forks restore copies). */
  private readonly snapshotMemory: MemoryCheckpoints

  /** `pause: memory` sessions' checkpoints, under the data dir (they outlive a restart). */
  private readonly checkpoints: MemoryCheckpoints

  /**
   * Whether the session is in use on this node: a turn of it runs, or a call that uses its
   * sandbox or workspace is under way (a snapshot, a restore, a setup command, a file written).
   * Its sandbox's cooldown then waits (the runtime decides this alone: a node cannot ask the API).
   */
  private inUse(sessionId: string): boolean {
    if ((this.calls.get(sessionId) ?? 0) > 0) return true
    if (this.commands.running(sessionId)) return true
    const prefix = `${sessionId}/`
    for (const key of this.turns.keys()) if (key.startsWith(prefix)) return true
    return false
  }

  /** Runs `fn` with the session counted as in use (see `inUse`). */
  private async using<T>(sessionId: string, fn: () => Promise<T>): Promise<T> {
    this.calls.set(sessionId, (this.calls.get(sessionId) ?? 0) + 1)
    try {
      return await fn()
    } finally {
      const left = (this.calls.get(sessionId) ?? 1) - 1
      if (left > 0) this.calls.set(sessionId, left)
      else {
        this.calls.delete(sessionId)
        this.pool.released(sessionId)
      }
    }
  }

  private pauseEvent(sessionId: string, event: PauseEvent): void {
    this.events?.pause(sessionId, event)
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
    const {
      sessionId,
      tenantId,
      dependencyEnvKey,
      imageKey,
      memoryAgentId,
      pause,
      egress,
      persist,
      ...launch
    } = spec
    await this.pool.drop(sessionId)
    const workspaceDir = this.runtime.pool.workspacePath(sessionId)
    const persisted = await this.persistLaunch(workspaceDir, persist, launch.isolation)
    const environment = launchEnvironment(this.envs.dependency(dependencyEnvKey), {
      ...launch.env,
      ...persisted?.env,
    })
    const memory = memoryAgentId ? [this.memory.bind(memoryAgentId)] : []
    const full: AgentLaunch = {
      ...launch,
      env: environment.env,
      binds: [...environment.binds, ...memory, ...(persisted?.binds ?? [])],
      home: persisted?.home,
      rootfs: this.rootfs(imageKey),
      sessionId,
      workspaceDir,
      egress: egress && {
        ...this.egressSite,
        ...egress,
        onEvent: (event) => this.events?.network(sessionId, event),
      },
    }
    const driver = this.runtime.driverFor(launch.isolation)
    if (!pause || !driver.capabilities.memorySnapshot) {
      await this.checkpoints.discard(sessionId)
      const agent = await this.runtime.startAgent(full)
      this.pool.add(sessionId, tenantId, agent)
      return this.info(sessionId, agent)
    }
    const started = await startFromCheckpoint(
      this.checkpoints,
      (l) => this.runtime.startAgent(l),
      { ...full, checkpointable: true },
      { generation: pause.generation, driver: driver.name },
    )
    if (started.resumed)
      this.pauseEvent(sessionId, {
        cause: 'memory_restored',
        detail: started.fromSnapshotId
          ? `restored from the memory of snapshot ${started.fromSnapshotId} into ${started.agent.sandboxId}`
          : started.agent.sandboxId,
      })
    else if (started.coldReason)
      this.pauseEvent(sessionId, { cause: 'memory_discarded', detail: started.coldReason })
    const { agent } = started
    this.pool.add(sessionId, tenantId, agent, () => this.pauseAgent(sessionId, tenantId, agent, pause))
    return { ...this.info(sessionId, agent), restored: started.resumed }
  }

  /**
   * Checkpoints a cooled `pause: memory` agent (which stops it) at the workspace's generation now
   * (its marker); one that fails, or that would not fit in the session's storage quota, leaves the
   * session as a stop would, with the reason.
   */
  private async pauseAgent(
    sessionId: string,
    tenantId: string,
    agent: AgentProcess,
    pause: { generation: number },
  ): Promise<void> {
    try {
      const [generation] = await this.runtime.pool.readGenerations([sessionId])
      const manifest = await this.checkpoints.save(sessionId, agent, generation ?? pause.generation, tenantId)
      const overQuota = await checkpointOverQuota(
        this.runtime.pool,
        [this.checkpoints, this.snapshotMemory],
        tenantId,
        manifest.bytes,
        {
          sessionId,
          except: sessionId,
        },
      )
      if (overQuota) {
        await this.checkpoints.discard(sessionId)
        this.pauseEvent(sessionId, {
          cause: 'memory_discarded',
          detail: `memory checkpoint not kept, stopped: quota_exceeded: ${overQuota}`,
        })
        return
      }
      this.pauseEvent(sessionId, {
        cause: 'memory_paused',
        detail: `checkpoint of ${manifest.bytes} bytes in ${manifest.checkpointMs} ms at generation ${manifest.generation}`,
      })
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error)
      this.pauseEvent(sessionId, {
        cause: 'memory_discarded',
        detail: `memory checkpoint failed, stopped: ${message}`,
      })
      await this.runtime.stopAgent(agent)
    }
  }

  async agent(sessionId: string): Promise<AgentInfo | undefined> {
    const agent = this.pool.agent(sessionId)
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
    const key = turnKey(sessionId, input.turnId)
    const controller = new AbortController()
    this.turns.set(key, controller)
    if (this.earlyCancels.delete(key)) controller.abort()
    return turnStream(
      async (onEvent, gate) => {
        let outcome: TurnOutcome
        try {
          outcome = await this.warmAgent(sessionId).runTurn(input, onEvent, controller.signal, gate)
        } finally {
          if (this.turns.get(key) === controller) this.turns.delete(key)
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
    const key = turnKey(sessionId, turnId)
    const running = this.turns.get(key)
    if (running) return running.abort()
    // Asked before the turn runs here (its sandbox still starting, or its call from an API
    // replica not arrived yet): it starts cancelled instead of running on unstopped.
    const nowMs = Date.now()
    for (const [early, untilMs] of this.earlyCancels) if (untilMs < nowMs) this.earlyCancels.delete(early)
    this.earlyCancels.set(key, nowMs + EARLY_CANCEL_KEEP_MS)
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
    await this.checkpoints.discard(sessionId)
  }

  stopAllAgents(): Promise<void> {
    return this.pool.dropAll()
  }

  checkpointForSnapshot(
    sessionId: string,
    snapshotId: string,
  ): Promise<{ bytes: number; checkpointMs: number }> {
    return this.using(sessionId, () => this.checkpointWarm(sessionId, snapshotId))
  }

  private async checkpointWarm(
    sessionId: string,
    snapshotId: string,
  ): Promise<{ bytes: number; checkpointMs: number }> {
    const warm = this.pool.agent(sessionId)
    if (!warm?.alive)
      throw new CairnProblem(
        'sandbox_not_running',
        `session ${sessionId} has no running sandbox: a snapshot with memory keeps a running sandbox's state (send it a message first)`,
      )
    if (!warm.checkpointable)
      throw new CairnProblem(
        'bad_request',
        `session ${sessionId}'s sandbox was not started to be checkpointed: only a pause: memory session's sandbox can be`,
      )
    const detached = this.pool.detach(sessionId)
    if (!detached)
      throw new CairnProblem('sandbox_not_running', `session ${sessionId} has no running sandbox`)
    const [generation] = await this.runtime.pool.readGenerations([sessionId])
    try {
      const manifest = await this.checkpoints.save(
        sessionId,
        detached.agent,
        generation ?? 0,
        detached.tenantId,
      )
      await this.checkpoints.copyTo(sessionId, this.snapshotMemory, snapshotId, { sessionId: snapshotId })
      const overQuota = await checkpointOverQuota(
        this.runtime.pool,
        [this.checkpoints, this.snapshotMemory],
        detached.tenantId,
        manifest.bytes,
        {
          except: snapshotId,
        },
      )
      if (overQuota) {
        await this.snapshotMemory.discard(snapshotId)
        throw new CairnProblem('quota_exceeded', `the snapshot's memory was not kept: ${overQuota}`)
      }
      return { bytes: manifest.bytes, checkpointMs: manifest.checkpointMs }
    } catch (error) {
      await this.runtime.stopAgent(detached.agent)
      throw error
    }
  }

  async forkMemory(snapshotId: string, childId: string, generation: number): Promise<boolean> {
    const copied = await this.snapshotMemory.copyTo(snapshotId, this.checkpoints, childId, {
      sessionId: childId,
      generation,
      fromSnapshotId: snapshotId,
    })
    return copied !== undefined
  }

  memoryCheckpointBytes(sessionIds: readonly string[]): Promise<number[]> {
    return Promise.all(sessionIds.map((id) => this.checkpoints.bytes(id)))
  }

  expireMemoryCheckpoints(cutoff: Date): Promise<{ sessionId: string; bytes: number }[]> {
    return this.checkpoints.expire(cutoff)
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

  async createWorkspace(sessionId: string, revisionId: string, tenantId: string): Promise<void> {
    await this.runtime.pool.createWorkspace(sessionId, revisionId, tenantId)
  }

  hasWorkspace(sessionId: string): Promise<boolean> {
    return this.runtime.pool.hasWorkspace(sessionId)
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
    const mark = await this.using(sessionId, () => this.snapshotFrozen(sessionId, snapshotId, tenantId))
    if (options?.ship) this.shipping?.enqueue(sessionId, snapshotId)
    return mark
  }

  private async snapshotFrozen(
    sessionId: string,
    snapshotId: string,
    tenantId: string,
  ): Promise<WorkspaceMark | undefined> {
    const warm = this.pool.agent(sessionId)
    await warm?.freeze()
    try {
      const ctransid = await this.runtime.pool.snapshotWorkspace(sessionId, snapshotId, tenantId)
      // Read while still frozen: nothing the sandbox writes from here on is in the snapshot.
      const writtenBytes = warm?.writtenBytes()
      if (!warm || ctransid === undefined || writtenBytes === undefined) return undefined
      return { sandboxId: warm.sandboxId, ctransid, writtenBytes }
    } finally {
      await warm?.thaw()
    }
  }

  /**
   * The same sandbox still running (one that stopped in between could have written and gone), no
   * page of file data dirtied by its processes (buffered writes reach btrfs's trees only when
   * flushed), and no inode of the workspace updated (the subvolume's ctransid).
   */
  async unchangedSince(sessionId: string, mark: WorkspaceMark): Promise<boolean> {
    const agent = this.pool.agent(sessionId)
    if (!agent?.alive || mark.sandboxId !== agent.sandboxId) return false
    // The change mark is asked first (the storage helper's round trip), the processes' written
    // bytes read while it is under way.
    const asked = this.runtime.pool.workspaceMark(sessionId).catch(() => undefined)
    const written = agent.writtenBytes()
    const ctransid = await asked
    if (written === undefined || written !== mark.writtenBytes) return false
    return ctransid !== undefined && ctransid === mark.ctransid
  }

  restoreWorkspace(
    sessionId: string,
    snapshotId: string,
    generation: number,
    tenantId: string,
  ): Promise<void> {
    return this.using(sessionId, () =>
      this.runtime.pool.restoreWorkspace(sessionId, snapshotId, generation, tenantId),
    )
  }

  async forkWorkspace(childId: string, snapshotId: string, tenantId: string): Promise<void> {
    await this.runtime.pool.forkWorkspace(childId, snapshotId, tenantId)
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.runtime.pool.deleteSnapshot(snapshotId)
    await this.snapshotMemory.discard(snapshotId)
  }

  async hasSnapshot(snapshotId: string): Promise<boolean> {
    return existsSync(this.runtime.pool.snapshotPath(snapshotId))
  }

  readGenerations(sessionIds: readonly string[]): Promise<(number | undefined)[]> {
    return this.runtime.pool.readGenerations([...sessionIds])
  }

  writeGeneration(sessionId: string, generation: number): Promise<void> {
    return this.runtime.pool.writeGeneration(sessionId, generation)
  }

  poolStats(): Promise<PoolStats> {
    return this.runtime.pool.poolStats()
  }

  async quotaStatus(): Promise<PoolQuotaStatus> {
    return this.runtime.pool.quotaStatus()
  }

  async tenantUsage(tenantIds: readonly string[]): Promise<Record<string, TreeSizes>> {
    return Object.fromEntries(await this.runtime.pool.tenantUsage([...tenantIds]))
  }

  async sandboxDriver(isolation?: IsolationName | undefined): Promise<SandboxDriverFacts> {
    const driver = this.runtime.driverFor(isolation)
    return {
      name: driver.name,
      capabilities: { ...driver.capabilities },
      ...(driver.unavailableBecause ? { unavailableBecause: { ...driver.unavailableBecause } } : {}),
    }
  }

  async describe(): Promise<RuntimeDescription> {
    const { pool, driver } = this.runtime
    return {
      drivers: await this.runtime.isolations(),
      isolation: { name: driver.name, description: driver.describe() },
      storage: { driver: pool.driver, capabilities: { ...pool.capabilities }, description: pool.describe() },
    }
  }

  listStored(area: PoolArea): Promise<string[]> {
    return this.runtime.pool.listArea(area)
  }

  recoverWorkspace(sessionId: string): Promise<void> {
    return this.runtime.pool.recoverWorkspace(sessionId)
  }

  discardStaging(name: string): Promise<void> {
    return this.runtime.pool.discardStagingByName(name)
  }

  /** Where a tree is on this machine's pool. */
  private path(tree: TreeRef): string {
    const { pool } = this.runtime
    if ('sessionId' in tree) return pool.workspacePath(tree.sessionId)
    if ('snapshotId' in tree) return pool.snapshotPath(tree.snapshotId)
    if ('stagedRevisionId' in tree) return this.stagingOf(tree.stagedRevisionId)
    return pool.revisionPath(tree.revisionId)
  }

  async hasTree(tree: TreeRef): Promise<boolean> {
    if ('stagedRevisionId' in tree && !this.staged.has(tree.stagedRevisionId)) return false
    return existsSync(this.path(tree))
  }

  hasPath(tree: TreeRef, rel: string): Promise<boolean> {
    return pathExists(this.path(tree), rel)
  }

  listFiles(tree: TreeRef, rel: Buffer, options: TreeReadOptions = {}): Promise<FileEntry[]> {
    return listDirectory(this.path(tree), rel, options)
  }

  openFile(
    tree: TreeRef,
    rel: Buffer,
    options: TreeReadOptions = {},
  ): Promise<{ size: number; stream: Readable }> {
    return openTreeFile(this.path(tree), rel, options)
  }

  diff(from: TreeRef, to: TreeRef, fromLabel: string, options: TreeReadOptions = {}): Promise<WorkspaceDiff> {
    return diffTrees(this.path(from), this.path(to), fromLabel, undefined, options)
  }

  digest(tree: TreeRef, options: TreeReadOptions = {}): Promise<string> {
    return treeDigest(this.path(tree), options)
  }

  treeSizes(tree: TreeRef): Promise<TreeSizes> {
    return this.runtime.pool.usage(this.path(tree))
  }

  async exportTree(tree: TreeRef): Promise<{ stream: Readable; stop: () => Promise<void> }> {
    return exportTree(this.path(tree))
  }

  /** Stops an agent's sandbox; the commands running in it end with it (their cause says so). */
  private async stopWithCommands(agent: AgentProcess): Promise<void> {
    const ending = this.commands.sandboxStopping(agent.sessionId)
    await this.runtime.stopAgent(agent)
    await ending
  }

  startCommand(start: CommandStart): Promise<CommandState> {
    return this.using(start.sessionId, async () => {
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
    return this.using(sessionId, () =>
      writeWorkspaceFile(this.runtime, this.runtime.pool.workspacePath(sessionId), rel, body),
    )
  }

  deletePath(sessionId: string, rel: string): Promise<void> {
    return this.using(sessionId, () =>
      deleteWorkspacePath(this.runtime, this.runtime.pool.workspacePath(sessionId), rel),
    )
  }

  replaceWorkspaceWithArchive(
    sessionId: string,
    tenantId: string,
    archive: Buffer,
    generation: number,
  ): Promise<void> {
    return this.using(sessionId, () => this.replaceWithArchive(sessionId, tenantId, archive, generation))
  }

  private async replaceWithArchive(
    sessionId: string,
    tenantId: string,
    archive: Buffer,
    generation: number,
  ): Promise<void> {
    const { pool } = this.runtime
    const staging = await pool.createWorkspaceStaging(
      `imp_${sessionId.slice(sessionId.indexOf('_') + 1)}`,
      tenantId,
    )
    try {
      await unpackIntoWorkspace(this.runtime, staging, archive)
      await chmod(staging, 0o700)
      await pool.replaceWorkspace(sessionId, staging, generation)
    } catch (error) {
      // The upload's error is the one to answer; a staging tree left behind is logged.
      await pool
        .discardStaging(staging)
        .catch((e: unknown) =>
          this.runtime.logger.warn({ err: e, staging }, 'discarding an upload staging tree failed'),
        )
      throw error
    }
  }

  unpackIntoWorkspace(sessionId: string, archive: Buffer): Promise<void> {
    return this.using(sessionId, async () => {
      const dir = this.runtime.pool.workspacePath(sessionId)
      await unpackIntoWorkspace(this.runtime, dir, archive)
      await chmod(dir, 0o700)
    })
  }

  /** In a fresh sandbox with its own run dir (an empty transcript), removed when it is done. */
  runCommand(
    command: WorkspaceCommand,
    onLine: (line: string) => void,
    signal?: AbortSignal | undefined,
  ): Promise<CommandResult> {
    return this.using(command.sessionId, () => this.runInWorkspace(command, onLine, signal))
  }

  private async runInWorkspace(
    command: WorkspaceCommand,
    onLine: (line: string) => void,
    signal: AbortSignal | undefined,
  ): Promise<CommandResult> {
    const { sessionId, isolation, dependencyEnvKey, imageKey, egress, persist, ...spec } = command
    const workspaceDir = this.runtime.pool.workspacePath(sessionId)
    const persisted = await this.persistLaunch(workspaceDir, persist, isolation)
    const environment = launchEnvironment(this.envs.dependency(dependencyEnvKey), {
      ...spec.env,
      ...persisted?.env,
    })
    const runDir = path.join(this.runtime.runDir, 'sandboxes', `setup-${sessionId}`)
    try {
      await mkdir(runDir, { recursive: true })
      await chmod(runDir, 0o755)
      await writeFile(path.join(runDir, 'transcript.jsonl'), '', { mode: 0o644 })
      return await runSandboxedCommand(this.runtime.driverFor(isolation), {
        ...spec,
        onLine,
        signal,
        egress: egress && {
          ...this.egressSite,
          ...egress,
          onEvent: (event) => this.events?.network(sessionId, event),
        },
        env: environment.env,
        binds: [...environment.binds, ...(persisted?.binds ?? [])],
        home: persisted?.home,
        rootfs: this.rootfs(imageKey),
        workspaceDir,
        runDir,
        logger: this.runtime.logger,
      })
    } finally {
      // The command's outcome is decided; a run dir left behind goes with the runtime's at shutdown.
      await rm(runDir, { recursive: true, force: true }).catch((error: unknown) =>
        this.runtime.logger.warn({ err: error, runDir }, 'removing a command run dir failed'),
      )
    }
  }

  /** The mounts of a sandbox's persisted paths (none declared: undefined); not under gVisor yet. */
  private async persistLaunch(
    workspaceDir: string,
    persist: readonly string[] | undefined,
    isolation: IsolationName | undefined,
  ) {
    if (!persist?.length) return undefined
    if (this.runtime.driverFor(isolation).name === 'gvisor')
      throw new CairnProblem(
        'unavailable',
        'persisted paths (cairn.yaml persist:) are not supported under gVisor yet',
      )
    return persistLaunch(workspaceDir, persist, this.runtime.emptyDir, (dir) =>
      this.runtime.pool.chownToSandbox(dir),
    )
  }

  /** The root filesystem of an image's sandboxes; undefined: the host's /usr. */
  private rootfs(imageKey: string | undefined): string | undefined {
    return imageKey ? this.images.rootfsPath(imageKey) : undefined
  }

  private stagingOf(revisionId: string): string {
    const staging = this.staged.get(revisionId)
    if (!staging) throw new CairnProblem('not_found', `revision ${revisionId} is not being deployed`)
    return staging
  }

  async stageRevision(revisionId: string, tenantId: string, archive: Buffer): Promise<void> {
    if (this.staged.has(revisionId))
      throw new CairnProblem('conflict', `revision ${revisionId} is staged already`)
    const staging = await this.runtime.pool.createStaging(revisionId, tenantId)
    this.staged.set(revisionId, staging)
    try {
      await extractArchive(archive, staging)
    } catch (error) {
      await this.discardStagedRevision(revisionId).catch((discardError: unknown) =>
        this.runtime.logger.warn({ err: discardError, staging }, "discarding a deploy's staging tree failed"),
      )
      throw error
    }
  }

  async buildRevision(build: RevisionBuild, onLog: (line: string) => void): Promise<RevisionBuildResult> {
    return this.revisionBuilder.build(build, this.stagingOf(build.revisionId), onLog)
  }

  async sealRevision(revisionId: string, tenantId: string): Promise<void> {
    await this.runtime.pool.sealRevision(this.stagingOf(revisionId), revisionId, tenantId)
    this.staged.delete(revisionId)
  }

  async discardStagedRevision(revisionId: string): Promise<void> {
    const staging = this.staged.get(revisionId)
    if (!staging) return
    await this.runtime.pool.discardStaging(staging)
    this.staged.delete(revisionId)
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
    return this.using(sessionId, () => shipping.restore(sessionId, tenantId, expected))
  }

  async shipPoolTree(tree: ShippedTree): Promise<{ shipped: boolean }> {
    if (!this.shipping) throw noBucket()
    return this.shipping.shipTree(tree)
  }

  async fetchPoolTree(tree: ShippedTree): Promise<void> {
    if (!this.shipping) throw noBucket()
    await this.shipping.fetchTree(tree)
  }

  async shippingLag(): Promise<NodeShippingLag> {
    return this.shipping?.lag() ?? { enabled: false, unshippedSnapshots: 0, secondsBehind: 0 }
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
