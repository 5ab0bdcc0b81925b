import { CairnProblem } from '@cairn/protocol'

export const STORAGE_DRIVERS = ['btrfs', 'dir'] as const
export type StorageDriverName = (typeof STORAGE_DRIVERS)[number]

export function isStorageDriver(value: unknown): value is StorageDriverName {
  return typeof value === 'string' && (STORAGE_DRIVERS as readonly string[]).includes(value)
}

export const POOL_AREAS = ['revisions', 'sessions', 'snapshots', 'staging'] as const
export type PoolArea = (typeof POOL_AREAS)[number]

/** The pool's filesystem: its size, what is used, and what is free for unprivileged writers. */
export interface PoolStats {
  totalBytes: number
  usedBytes: number
  freeBytes: number
}

/** Bytes a tree uses (see `StoragePool.usage`). */
export interface TreeSizes {
  referencedBytes: number
  exclusiveBytes: number
}

/**
 * The storage limits a pool enforces (all in bytes; unset: none). `workspaceBytes` caps what one
 * workspace references (everything its /workspace holds, whatever snapshots share); `tenantBytes`
 * caps what one tenant's trees hold exclusively (workspaces, snapshots, revisions, counted once
 * where they share, i.e. what deleting them all would free); `reserveBytes` is kept free for
 * Cairn's own writes: all agents' trees together may hold at most the pool's size less it.
 */
export interface PoolQuotas {
  workspaceBytes?: number | undefined
  tenantBytes?: number | undefined
  reserveBytes?: number | undefined
  /**
   * What the shared images (every tenant's agent images, one tree per image) may hold together:
   * a build or pull that would pass it is refused, or stopped (`images_quota_exceeded`).
   */
  imagesBytes?: number | undefined
}

/** What `StoragePool.quotaStatus` reports (and `GET /v1/runtime` shows). */
export interface PoolQuotaStatus extends PoolQuotas {
  /** Whether the limits are enforced (false: the driver cannot, see `warning`). */
  enforced: boolean
  /**
   * btrfs: `simple` quotas (kernel 6.7+: an extent counts for the tree that wrote it, so snapshots
   * and writes stay O(1)) or `full` qgroups (a pool that had them, older kernels).
   */
  accounting?: 'simple' | 'full' | undefined
  /** Bytes all agents' trees together may hold (the pool's size less the reserve). */
  agentsTotalBytes?: number | undefined
  /**
   * For operators: the limits are not enforced (`quotas_unavailable`), or enforced against figures
   * the kernel marked inconsistent, a rescan started at open (`quotas_inexact`).
   */
  warning?: { code: 'quotas_unavailable' | 'quotas_inexact'; message: string } | undefined
}

/** Where a pool keeps its trees, who owns workspaces, and the optional per-workspace size limit. */
export interface StoragePoolOptions {
  /** Where the pool is mounted (a directory the sandbox uid can traverse). */
  mountPoint: string
  /** Host uid/gid that owns session workspaces. */
  sandboxUid: number
  sandboxGid: number
  /** Size limit of every session workspace; unset: no limit. */
  workspaceQuotaBytes?: number | undefined
  /** Limit of what each tenant's trees hold together; unset: no limit. */
  tenantQuotaBytes?: number | undefined
  /** Bytes kept free for Cairn's own writes (agents' trees may use the rest); unset: none. */
  reserveBytes?: number | undefined
  /** Limit of the shared images' group; unset: half of what agents' trees may use (btrfs). */
  imagesQuotaBytes?: number | undefined
}

/** What the shared images' group holds and may hold, in bytes. */
export interface ImagesUsage {
  usedBytes: number
  quotaBytes: number
}

/**
 * The workspace store: revisions (read-only trees of deployed projects), session workspaces (a
 * writable copy of a revision each), snapshots (read-only copies of a workspace) and staging
 * trees being filled. `btrfs` makes every copy an O(1) subvolume snapshot; `dir` copies files
 * (`cp -a --reflink=auto`) where btrfs is not available. The server sees only this interface.
 */
export interface StoragePool {
  readonly driver: StorageDriverName
  /** What this driver can do: size limits per workspace, copies whose cost does not grow with the file count. */
  readonly capabilities: { quotas: boolean; constantTimeCopies: boolean }
  readonly root: string
  open(): Promise<void>
  close(): Promise<void>
  describe(): string

  areaDir(area: PoolArea): string
  revisionPath(revisionId: string): string
  workspacePath(sessionId: string): string
  snapshotPath(snapshotId: string): string
  listArea(area: PoolArea): Promise<string[]>

  /** The limits this pool enforces, or why it cannot (valid after `open`). */
  quotaStatus(): PoolQuotaStatus

  /**
   * Methods that make a tree take `tenantId`: the tenant whose quota the tree counts against
   * (unset: the trees of no tenant, which share one group: a fetch's staging before it is placed).
   */
  /** A fresh writable tree in staging, to be filled and then sealed. */
  createStaging(name: string, tenantId?: string): Promise<string>
  /** Seals a filled staging tree as a read-only revision owned by the sandbox uid (consumes it). */
  sealRevision(stagingDir: string, revisionId: string, tenantId?: string): Promise<string>
  /** Seals a filled staging tree read-only at `target` (consumes it; used for a tenant's environments). */
  sealStaging(stagingDir: string, target: string, tenantId?: string): Promise<void>
  /** A fresh writable tree in staging for an agent image, counted in the shared images' group. */
  createImageStaging(name: string): Promise<string>
  /** Seals an image's filled staging tree read-only at `target`, in the images' group (consumes it). */
  sealImageStaging(stagingDir: string, target: string): Promise<void>
  /** The images' group's figures (after a sync); undefined where the pool enforces no limit on it. */
  imagesUsage(): Promise<ImagesUsage | undefined>
  discardStaging(stagingDir: string): Promise<void>
  discardStagingByName(name: string): Promise<void>
  hasRevision(revisionId: string): Promise<boolean>
  deleteRevision(revisionId: string): Promise<void>

  /** New session workspace: a writable copy of the revision, at generation 0. */
  createWorkspace(sessionId: string, revisionId: string, tenantId?: string): Promise<string>
  hasWorkspace(sessionId: string): Promise<boolean>
  deleteWorkspace(sessionId: string): Promise<void>
  /** An empty staging tree owned by the sandbox uid, to fill and swap in with `replaceWorkspace`. */
  createWorkspaceStaging(name: string, tenantId?: string): Promise<string>
  /** Swaps a filled staging tree in as the workspace, its marker set to `generation` first. */
  replaceWorkspace(sessionId: string, stagingDir: string, generation?: number): Promise<void>
  /** Finishes or rolls back a restore or import that a crash interrupted. */
  recoverWorkspace(sessionId: string): Promise<void>
  chownToSandbox(dir: string): Promise<void>

  /**
   * Read-only copy of a session's workspace (the caller freezes the sandbox around it). Resolves
   * to the workspace's change mark right after it (see `workspaceMark`), undefined where the
   * driver has none.
   */
  snapshotWorkspace(sessionId: string, snapshotId: string, tenantId?: string): Promise<number | undefined>
  /**
   * A number that moves whenever the workspace's files are changed on disk (btrfs: the subvolume's
   * ctransid), so a turn that changed nothing needs no new snapshot; undefined where the driver
   * cannot tell cheaply (then a snapshot is always taken).
   */
  workspaceMark(sessionId: string): Promise<number | undefined>
  hasSnapshot(snapshotId: string): Promise<boolean>
  /**
   * Replaces the workspace with a writable copy of the snapshot: exact, nothing left from after
   * it; the incoming copy's marker is set to `generation` before it is swapped in.
   */
  restoreWorkspace(
    sessionId: string,
    snapshotId: string,
    generation?: number,
    tenantId?: string,
  ): Promise<void>
  /** A new session's workspace as a writable copy of a snapshot (fork). */
  forkWorkspace(sessionId: string, snapshotId: string, tenantId?: string): Promise<string>
  deleteSnapshot(snapshotId: string): Promise<void>

  /**
   * Workspace generation markers: a `trusted.cairn.generation` xattr on the workspace's root
   * directory. It is part of the tree (every snapshot and copy carries it, a tree swapped in behind
   * Cairn's back brings its own older number), and only CAP_SYS_ADMIN on the host can read or
   * write it, so no sandbox can forge it.
   */
  writeGeneration(sessionId: string, generation: number): Promise<void>
  /** The marker of each workspace (`undefined`: no marker, or no workspace). */
  readGenerations(sessionIds: string[]): Promise<(number | undefined)[]>

  /**
   * Bytes a tree (workspace, snapshot, revision) uses, measured now: referenced (all its data)
   * and exclusive (data no other tree shares: what deleting it alone would free). Exclusive
   * changes when a tree sharing its data is written or deleted, so callers must not cache it.
   */
  usage(dir: string): Promise<TreeSizes>
  poolStats(): Promise<PoolStats>
  /** What each tenant's trees hold (see `PoolQuotas.tenantBytes`); empty where not measured cheaply. */
  tenantUsage(tenantIds: string[]): Promise<Map<string, TreeSizes>>
}

/** Pool entries are named by prefixed IDs only: nothing a caller passes can address another path. */
export function safeName(id: string): string {
  if (!/^[a-z]+_[0-9a-z]+$/.test(id)) throw new CairnProblem('bad_request', `invalid identifier '${id}'`)
  return id
}
