import type { Duplex, Readable } from 'node:stream'
import type { FileEntry, WorkspaceDiff } from '@cairn/protocol'
import type { AgentLaunch, TurnInput } from '../agent/types.js'
import type { RevisionBuild, RevisionBuildResult } from '../build/revision-builder.js'
import type { CommandResult, CommandSpec } from '../build/run-command.js'
import type {
  CommandRead,
  CommandReadRequest,
  CommandStart,
  CommandState,
} from '../commands/node-commands.js'
import type { EgressPolicy } from '../egress/policy.js'
import type { EgressRoute, NetworkEvent } from '../egress/proxy.js'
import type { ProxySecret } from '../egress/proxy-secrets.js'
import type { ImageBuildContext } from '../images/image-builder.js'
import type { ImageRecipe } from '../images/image-recipe.js'
import type { ImageRecord } from '../images/image-store.js'
import type { IsolationInfo } from '../runtime.js'
import type { DriverCapabilities, IsolationName } from '../sandbox/driver.js'
import type { PoolArea, PoolQuotaStatus, PoolStats, TreeSizes } from '../storage/pool.js'
import type { ReadOptions } from '../workspace-io/reader.js'
import type { AgentInfo } from './agent-info.js'
import type { ShippedTree } from './pool-tree-shipping.js'
import type { TurnMessage } from './turn-stream.js'

export type {
  CommandRead,
  CommandReadRequest,
  CommandStart,
  CommandState,
} from '../commands/node-commands.js'
export type { AgentInfo } from './agent-info.js'
export type { ShippedTree } from './pool-tree-shipping.js'

/**
 * What a session's agent is started with: everything of a launch but its host paths (workspace,
 * root filesystem, mounts), plus the tenant it counts against and, by key, what the runtime mounts:
 * the revision's dependency environment, its image and the agent's memory.
 */
export type AgentSpec = Omit<
  AgentLaunch,
  'workspaceDir' | 'binds' | 'rootfs' | 'resume' | 'checkpointable' | 'egress'
> & {
  /**
   * Egress allowlist (without one, or with an empty one, the sandbox has loopback only). The
   * node adds its operator's settings (`EgressSite`); its decisions go to `RuntimeEvents.network`.
   */
  egress?: AgentEgress | undefined
  tenantId: string
  /** The revision's dependency environment (mounted at /env, its variables set). */
  dependencyEnvKey?: string | undefined
  /** The image the sandbox runs on; undefined: the host's /usr. */
  imageKey?: string | undefined
  /** The agent whose memory (see `publishMemory`) is mounted read-only at /memory. */
  memoryAgentId?: string | undefined
  /**
   * Sandbox paths kept with the workspace (cairn.yaml's `persist:`, resolved): each bound from
   * the subvolume's `.cairn-persist/<path>`, HOME then /home/agent (see `persistLaunch`).
   */
  persist?: readonly string[] | undefined
  /**
   * `pause: memory`: when keep-warm ends the sandbox is checkpointed instead of stopped, and the
   * next start restores it (drivers with `memorySnapshot`; elsewhere ignored).
   */
  pause?: AgentPause | undefined
}

/** A sandbox's way out as the server gives it: plain data (the node adds its `EgressSite`). */
export interface AgentEgress {
  policy: EgressPolicy
  /** `proxy`-scoped secrets: the environment holds each stand-in, the proxy swaps in the value. */
  secrets?: readonly ProxySecret[] | undefined
  /** Extra CA certificates (PEM) the proxy trusts for upstream TLS. */
  upstreamCaPems?: readonly string[] | undefined
}

/** A session's memory checkpoints: the generation they are tied to (events: `RuntimeEvents.pause`). */
export interface AgentPause {
  /** The workspace generation now: a checkpoint taken at another one is discarded, not restored. */
  generation: number
}

/** What became of a session's memory checkpoint, for its events (`detail` says why or how much). */
export interface PauseEvent {
  cause: 'memory_paused' | 'memory_restored' | 'memory_discarded'
  detail: string
}

/**
 * What the runtime tells the server over a sandbox's life, outside any one call: given to the
 * port's constructor by the composition root (a remote port relays the node's event stream).
 */
/** How a snapshot is taken. */
export interface SnapshotOptions {
  /**
   * Ship it to the node's bucket after it is taken (never waited for; a node without a bucket
   * ignores it). The node records the confirmed link against the session's owner epoch.
   */
  ship?: boolean | undefined
}

/**
 * The chain link a restore must end at, as the session's owner recorded it under its owner epoch
 * (`sessions.shipped_link_seq`, `shipped_tree_digest`): anyone with the bucket's keys can add a
 * newer link, so the bucket's newest is never taken on its own word.
 */
export interface ShippedHead {
  seq: number
  treeDigest: string
}

/** A workspace restored from the shipping bucket (`restoreFromBucket`). */
export interface BucketRestore {
  /** The snapshot it came back from (now in this node's pool too). */
  snapshotId: string
  /** The workspace generation that snapshot carried; the workspace is marked with it. */
  generation: number
  /** The chain link's number, its tree digest, and when it was shipped. */
  seq: number
  treeDigest: string
  shippedAt: string
  /** Bytes read from the bucket. */
  streamBytes: number
}

/**
 * Shipping lag of a node: snapshots not yet confirmed in the bucket, the oldest one's age, and the
 * sessions whose last ship attempt failed (the store down or hung; retried with backoff).
 */
export interface NodeShippingLag {
  enabled: boolean
  unshippedSnapshots: number
  secondsBehind: number
  failingSessions: number
}

/** A terminal's size, in characters. */
export interface TerminalSize {
  rows: number
  cols: number
}

export interface RuntimeEvents {
  /** A `pause: memory` session's checkpoint was taken, restored or discarded. */
  pause(sessionId: string, event: PauseEvent): void
  /** A decision of the egress proxy of a session's agent or setup command. */
  network(sessionId: string, event: NetworkEvent): void
}

/**
 * The workspace as of a snapshot, to tell later whether a turn changed it: the warm sandbox that
 * was frozen, the subvolume's ctransid and the sandbox's dirtied-bytes counter at that instant.
 */
export interface WorkspaceMark {
  sandboxId: string
  ctransid: number
  writtenBytes: number
}

/**
 * A command run in a session's workspace (setup phases): a command spec without host paths or
 * callbacks (output lines are the call's `onLine`, egress decisions go to `RuntimeEvents.network`).
 */
export type WorkspaceCommand = Omit<
  CommandSpec,
  'workspaceDir' | 'runDir' | 'logger' | 'binds' | 'rootfs' | 'onLine' | 'signal' | 'egress'
> & {
  /** The command's allowlist (the node adds its `EgressSite`); without one: loopback only. */
  egress?: Pick<EgressRoute, 'policy'> | undefined
  sessionId: string
  /** The image the command runs on; undefined: the host's /usr. */
  imageKey?: string | undefined
  /** The revision's dependency environment, by key (mounted at /env, its variables set). */
  dependencyEnvKey?: string | undefined
  /** The sandbox driver to run under (the runtime's default when unset). */
  isolation?: IsolationName | undefined
  /** The agent's persisted paths (`AgentSpec.persist`): mounted as for the agent, HOME its home. */
  persist?: readonly string[] | undefined
}

/** A sandbox driver of this node: its name, what it can do, and why it cannot do the rest. */
export interface SandboxDriverFacts {
  name: string
  capabilities: DriverCapabilities
  unavailableBecause?: Partial<Record<keyof DriverCapabilities, string>> | undefined
}

/** The runtime's drivers as `GET /v1/runtime` shows them. */
export interface RuntimeDescription {
  drivers: IsolationInfo[]
  /** The default sandbox driver's name and description. */
  isolation: { name: string; description: string }
  storage: {
    driver: string
    capabilities: { quotas: boolean; constantTimeCopies: boolean }
    description: string
  }
}

/**
 * A tree of the pool, by ID: a session's live workspace, a snapshot, a revision, or a revision
 * being deployed (staged by `stageRevision`, not sealed yet).
 */
export type TreeRef =
  | { sessionId: string }
  | { snapshotId: string }
  | { revisionId: string }
  | { stagedRevisionId: string }

/**
 * Options of a read (a walk of the tree, a file streamed); `signal` stops it (a remote port
 * carries it as the call's stream being reset).
 */
export type TreeReadOptions = ReadOptions

/**
 * What a turn does on the node besides running, so that a turn crosses to a remote runtime once
 * (one call instead of a resume, the turn, a look at the agent and its cooldown).
 */
export interface TurnOptions {
  /**
   * Takes the session's warm agent first (as `resumeAgent`: its cooldown stopped), told as the
   * turn's first message (`started`); without one the turn's only message is `cold` and nothing
   * runs (the caller starts the agent and asks again without `resume`).
   */
  resume?: boolean | undefined
  /**
   * After the outcome: a sandbox still alive cools down for this long (as `coolDown`), a dead
   * one is stopped (as `stopAgent`); the outcome message says which (`after.agent`).
   */
  keepWarmMs?: number | undefined
  /**
   * With `keepWarmMs`: after the cooldown, whether the workspace is exactly as at `mark` (as
   * `unchangedSince`), answered as `after.unchanged`.
   */
  mark?: WorkspaceMark | undefined
}

/** The cap on one tenant's running sandboxes, and whose are running turns (not to be stopped). */
export interface Admission {
  sessionId: string
  tenantId: string
  maxSandboxesPerTenant: number
  /** Sessions now running a turn or an exclusive operation: their sandboxes are never stopped for room. */
  busy: readonly string[]
}

/**
 * The runtime's port: how the server starts, stops and talks to agents and changes workspaces.
 * It speaks in session, snapshot, revision and sandbox IDs and plain data (and byte streams),
 * never host paths or processes, so that a runtime on another machine can stand behind it: every
 * method is async, and a callback is either per call (a log line, an abort signal: a remote port
 * carries them as frames of the call's stream) or a `RuntimeEvents` observer's, given to the
 * port's constructor. `LocalRuntimePort` calls the runtime in this process.
 */
export interface RuntimePort {
  // --- agents -------------------------------------------------------------------------------
  /**
   * Makes room for the session's sandbox under its tenant's cap: idle sandboxes of the tenant are
   * stopped, least recently used first; `sandbox_limit_reached` when every one is busy. The
   * answer releases the reserved slot once the sandbox is up (or the turn is over).
   */
  admitAgent(admission: Admission): Promise<() => Promise<void>>
  /** The session's warm agent if it is alive, its cooldown stopped while a turn uses it. */
  resumeAgent(sessionId: string): Promise<AgentInfo | undefined>
  /** Starts the session's agent (cold; a dead one left is stopped first) and keeps it warm. */
  startAgent(spec: AgentSpec): Promise<AgentInfo>
  /** The session's warm agent, if it has one. */
  agent(sessionId: string): Promise<AgentInfo | undefined>
  /**
   * Runs one turn on the session's warm agent, started at once: its messages as they happen, the
   * outcome last (a remote runtime sends them as frames of one stream). A turn that cannot run
   * ends the iteration with an error; a reader that stops before the outcome cancels the turn.
   * `options`: what else the call does on the node (see `TurnOptions`).
   */
  runTurn(sessionId: string, input: TurnInput, options?: TurnOptions): AsyncIterable<TurnMessage>
  /** Cancels the session's turn `turnId` if it is running: its outcome is then `cancelled`. */
  cancelTurn(sessionId: string, turnId: string): Promise<void>
  /** After a turn: the sandbox stays warm for `keepWarmMs`, then stops (now when 0). */
  coolDown(sessionId: string, keepWarmMs: number): Promise<void>
  /**
   * Moves a cooling sandbox's stop to at least `ms` from now (never earlier); `activity`: the
   * session was used outside a turn (a preview request), so it is the most recently used.
   */
  keepWarm(sessionId: string, ms: number, activity?: boolean): Promise<void>
  /** Stops the session's agent and sandbox, if any, and forgets its memory checkpoint. */
  stopAgent(sessionId: string): Promise<void>
  stopAllAgents(): Promise<void>
  /** How many agents are warm. */
  warmCount(): Promise<number>
  /** TCP ports a service listens on inside the session's sandbox (empty without one). */
  listeningPorts(sessionId: string): Promise<number[]>
  /** A byte stream to 127.0.0.1:`port` inside the session's running sandbox (previews). */
  connectPort(sessionId: string, port: number): Promise<Duplex>

  // --- workspaces and snapshots ---------------------------------------------------------------
  createWorkspace(sessionId: string, revisionId: string, tenantId: string): Promise<void>
  hasWorkspace(sessionId: string): Promise<boolean>
  deleteWorkspace(sessionId: string): Promise<void>
  /**
   * A read-only snapshot of the workspace, with the session's warm sandbox (if any) frozen while
   * it is taken. Returns the workspace's mark when it could be read (see `WorkspaceMark`).
   */
  snapshotWorkspace(
    sessionId: string,
    snapshotId: string,
    tenantId: string,
    options?: SnapshotOptions,
  ): Promise<WorkspaceMark | undefined>
  /** Whether the workspace is exactly as it was at `mark` (any doubt answers false). */
  unchangedSince(sessionId: string, mark: WorkspaceMark): Promise<boolean>
  /** Replaces the workspace with the snapshot, as generation `generation`. */
  restoreWorkspace(sessionId: string, snapshotId: string, generation: number, tenantId: string): Promise<void>
  /** A new workspace for `childId` from the snapshot (it carries the snapshot's generation marker). */
  forkWorkspace(childId: string, snapshotId: string, tenantId: string): Promise<void>
  deleteSnapshot(snapshotId: string): Promise<void>
  hasSnapshot(snapshotId: string): Promise<boolean>
  readGenerations(sessionIds: readonly string[]): Promise<(number | undefined)[]>
  writeGeneration(sessionId: string, generation: number): Promise<void>
  poolStats(): Promise<PoolStats>
  /** The storage limits in force, and a warning when they cannot be enforced. */
  quotaStatus(): Promise<PoolQuotaStatus>
  /** What each tenant's trees hold against its quota, by tenant ID. */
  tenantUsage(tenantIds: readonly string[]): Promise<Record<string, TreeSizes>>
  /** The driver a sandbox of `isolation` runs under (the node's default when unset). */
  sandboxDriver(isolation?: IsolationName | undefined): Promise<SandboxDriverFacts>
  /** The sandbox drivers and the storage pool, for `GET /v1/runtime` and the logs. */
  describe(): Promise<RuntimeDescription>
  /** The names (IDs) stored in one area of the pool, for the start-up check against the database. */
  listStored(area: PoolArea): Promise<string[]>
  /** Finishes a restore or import a crash interrupted (the workspace is the old or the new one). */
  recoverWorkspace(sessionId: string): Promise<void>
  /** Removes a staging tree (an upload or a deploy a crash left) by its name. */
  discardStaging(name: string): Promise<void>

  // --- reading trees (run by the runtime's reader, never following a link) -------------------
  /** Whether the tree exists in the pool. */
  hasTree(tree: TreeRef): Promise<boolean>
  /**
   * Whether anything is at `rel` in the tree (a link counts, never followed; a link among its
   * parents means no): for callers that read a file only when one is there; the read itself goes
   * through `openFile`. Walked by descriptors like every read, so where a link points on the host
   * never changes the answer; a missing first component costs one `lstat` and no process.
   */
  hasPath(tree: TreeRef, rel: string): Promise<boolean>
  /** One directory of the tree (`rel`: the path's bytes below its root; empty: the root). */
  listFiles(tree: TreeRef, rel: Buffer, options?: TreeReadOptions): Promise<FileEntry[]>
  /** A regular file of the tree, opened for streaming: its size and exactly its bytes. */
  openFile(tree: TreeRef, rel: Buffer, options?: TreeReadOptions): Promise<{ size: number; stream: Readable }>
  /** What changed from `from` to `to`; `fromLabel` is what the answer says it is from. */
  diff(from: TreeRef, to: TreeRef, fromLabel: string, options?: TreeReadOptions): Promise<WorkspaceDiff>
  /** The tree's content digest (`sha256:…`, see `treeDigest`). */
  digest(tree: TreeRef, options?: TreeReadOptions): Promise<string>
  /** Referenced and exclusive bytes of the tree. */
  treeSizes(tree: TreeRef): Promise<TreeSizes>
  /** Bytes each session's memory checkpoint holds on disk (0 without one), in the order asked. */
  memoryCheckpointBytes(sessionIds: readonly string[]): Promise<number[]>
  /**
   * Keeps the memory of the session's warm, checkpointable sandbox as `snapshotId`'s (a snapshot
   * with memory): the sandbox is checkpointed as the session's own `pause: memory` checkpoint (its
   * next start restores it, so the session goes on where it was) and the image is copied for the
   * snapshot. `sandbox_not_running` without a warm sandbox.
   */
  checkpointForSnapshot(
    sessionId: string,
    snapshotId: string,
  ): Promise<{ bytes: number; checkpointMs: number }>
  /**
   * Puts the session's running state in its own memory checkpoint for a fork with memory: its
   * warm, checkpointable sandbox is checkpointed (which stops it, so nothing it runs writes the
   * workspace after that instant), or the checkpoint its pause kept at the workspace's generation
   * now is the one (`wasPaused`). `sandbox_not_running` with neither; `bad_request` for a warm
   * sandbox not started to be checkpointed.
   */
  checkpointForFork(sessionId: string): Promise<ForkCheckpoint>
  /**
   * Copies the session's memory checkpoint as `snapshotId`'s memory (a fork of the snapshot
   * starts from it); `quota_exceeded` keeps none.
   */
  keepSnapshotMemory(sessionId: string, snapshotId: string, tenantId: string): Promise<void>
  /**
   * The session's memory checkpoint here (see `checkpointForFork`) as an archive, for a move to
   * another node; `sandbox_not_running` without one.
   */
  exportMemory(sessionId: string): Promise<{ stream: Readable; stop: () => Promise<void> }>
  /** Keeps a checkpoint exported by another node as the session's, at workspace `generation`. */
  importMemory(sessionId: string, archive: Buffer, generation: number): Promise<void>
  /**
   * Seeds a fork's memory checkpoint from its snapshot's memory, at the fork's workspace
   * `generation`: the fork's first start restores it. False: the snapshot kept no memory.
   */
  forkMemory(snapshotId: string, childId: string, generation: number): Promise<boolean>
  /** Deletes the memory checkpoints taken before `cutoff` (retention); whose, and their bytes. */
  expireMemoryCheckpoints(cutoff: Date): Promise<{ sessionId: string; bytes: number }[]>
  /** A tar.gz of a snapshot or a revision (trees nothing changes); `stop` ends it early. */
  exportTree(tree: TreeRef): Promise<{ stream: Readable; stop: () => Promise<void> }>

  // --- commands in a workspace ---------------------------------------------------------------
  /** Writes a file of the workspace from a stream, inside a sandbox that sees only the workspace. */
  writeFile(sessionId: string, rel: string, body: Readable): Promise<void>
  /** Deletes a file or a tree of the workspace, inside a sandbox. */
  deletePath(sessionId: string, rel: string): Promise<void>
  /**
   * Replaces the workspace with a tar.gz (checked by the caller), unpacked in a sandbox into a
   * staging tree marked as generation `generation`, then swapped in; nothing changes on failure.
   */
  replaceWorkspaceWithArchive(
    sessionId: string,
    tenantId: string,
    archive: Buffer,
    generation: number,
  ): Promise<void>
  /** Unpacks a tar.gz (checked by the caller) over the workspace, in a sandbox. */
  unpackIntoWorkspace(sessionId: string, archive: Buffer): Promise<void>
  /**
   * Runs a command in the workspace to completion (a setup phase): each output line (stdout and
   * stderr as they arrive) goes to `onLine`; `signal` stops it (the result says `cancelled`).
   */
  runCommand(
    command: WorkspaceCommand,
    onLine: (line: string) => void,
    signal?: AbortSignal | undefined,
  ): Promise<CommandResult>

  // --- commands beside the agent (docs/commands.md) ------------------------------------------
  /**
   * Starts a command in the session's running sandbox (`sandbox_not_running` without one: the
   * caller starts it as a turn would). While it runs the sandbox stays warm (up to the command's
   * timeout); its output goes to a bounded log on the node, read by offset.
   */
  startCommand(start: CommandStart): Promise<CommandState>
  /**
   * The command's output from byte `offset` (up to `maxBytes`), with its state; `waitMs`: a read
   * of a running command that finds nothing new waits that long for output or its end first.
   * `command_not_found` when the node keeps nothing of it.
   */
  readCommand(request: CommandReadRequest): Promise<CommandRead>
  /** Writes to the command's stdin (`close`: then closes it); `conflict` once it is closed. */
  writeCommandInput(
    sessionId: string,
    commandId: string,
    data: Uint8Array,
    close: boolean,
  ): Promise<CommandState>
  /** Sends a signal (a `COMMAND_SIGNALS` name) to the command's process group. */
  signalCommand(sessionId: string, commandId: string, signal: string): Promise<CommandState>
  /** Resizes the terminal of a command started with `tty` (others: nothing changes). */
  resizeCommand(sessionId: string, commandId: string, size: TerminalSize): Promise<CommandState>

  // --- revisions: deploys and their builds --------------------------------------------------
  /**
   * Unpacks a project archive (checked by the caller) into a new staging tree for the revision;
   * what the file system refuses is `invalid_archive`. Read it as `{ stagedRevisionId }`.
   */
  stageRevision(revisionId: string, tenantId: string, archive: Buffer): Promise<void>
  /**
   * Builds the staged revision: its dependency environment (reused when one with its key exists),
   * then its setup command, in sandboxes; each line of output goes to `onLog`.
   */
  buildRevision(build: RevisionBuild, onLog: (line: string) => void): Promise<RevisionBuildResult>
  /** Seals the staged revision read-only as `{ revisionId }` (sessions are made from it). */
  sealRevision(revisionId: string, tenantId: string): Promise<void>
  /** Removes a revision's staging tree (a failed deploy); nothing when there is none. */
  discardStagedRevision(revisionId: string): Promise<void>
  /**
   * A revision or a dependency environment, whole, as a tar stream for a node that lacks it (the
   * cluster ships both before a node's first session of the revision). `not_found` when absent.
   */
  exportPoolTree(tree: ShippedTree): Promise<Readable>
  /**
   * Makes the tree here from `exportPoolTree`'s stream, sealed read-only; one already here is kept
   * (the stream is drained). Nothing is left when the stream breaks.
   */
  importPoolTree(tree: ShippedTree, tenantId: string, stream: Readable): Promise<void>

  // --- the shipping bucket (docs/shipping.md; `unavailable` on a node without one) -------------
  /**
   * Restores the session's workspace here from chain link `expected.seq` in the bucket (links
   * after it are ignored), as the generation that link carries (the snapshot is kept in the pool
   * too); shipping then continues that chain. `state_lost` when nothing of the session was
   * shipped; `chain_invalid` when that link is missing, its tree digest is not `expected`'s, or
   * what the bucket holds does not check. The caller holds the session exclusively.
   */
  restoreFromBucket(sessionId: string, tenantId: string, expected: ShippedHead): Promise<BucketRestore>
  /** Ships a revision or dependency environment to the bucket once (false: it was already there). */
  shipPoolTree(tree: ShippedTree): Promise<{ shipped: boolean }>
  /**
   * Fetches a shipped revision or dependency environment into this pool, sealed read-only, in its
   * tenant's quota group (like every tree of the tenant's).
   */
  fetchPoolTree(tree: ShippedTree, tenantId: string): Promise<void>
  /** How far this node's shipping is behind (all zero and `enabled: false` without a bucket). */
  shippingLag(): Promise<NodeShippingLag>

  // --- images (the context's `log` gets the lines of this call: a remote port sends them as frames)
  /** The key of the recipe's image (an OCI tag is resolved to its digest now); undefined: host. */
  imageKeyOf(recipe: ImageRecipe, ctx: ImageBuildContext): Promise<string | undefined>
  hasImage(key: string): Promise<boolean>
  /** Builds or pulls the image `key` of `recipe` unless it is built (one build per key at a time). */
  ensureImage(recipe: ImageRecipe, key: string, ctx: ImageBuildContext): Promise<void>
  image(key: string): Promise<ImageRecord | undefined>
  listImages(): Promise<ImageRecord[]>
  /** Removes an image; fails while a sandbox still mounts it. */
  removeImage(key: string): Promise<void>

  // --- agent memory ---------------------------------------------------------------------------
  /** Makes `content` (version `version`) the memory mounted in the agent's next sandboxes. */
  publishMemory(agentId: string, version: number, content: string): Promise<void>
}

/** What `checkpointForFork` kept: the image's bytes, how long it took, and whether it was there already. */
export interface ForkCheckpoint {
  bytes: number
  checkpointMs: number
  /** The sandbox was paused already (its keep-warm window had ended): its checkpoint is the one. */
  wasPaused: boolean
}
