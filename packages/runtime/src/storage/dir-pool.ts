import { chmod, mkdir, readdir, rename } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { execTool } from '../util/exec.js'
import { findMount } from '../util/mounts.js'
import { BtrfsOps } from './btrfs-ops.js'
import {
  POOL_AREAS,
  type PoolQuotaStatus,
  type StoragePool,
  type StoragePoolOptions,
  safeName,
  type TreeSizes,
} from './pool.js'
import { PoolLayout } from './pool-layout.js'
import { removeTree } from './remove-tree.js'

export interface DirPoolOptions extends StoragePoolOptions {
  /** The directory that holds the trees (kept across restarts); bind-mounted at `mountPoint`. */
  storePath: string
}

/** Copies in progress carry this suffix behind a leading dot: `listArea` never reports them. */
const COPYING = '.copying'

/**
 * The fallback store where no btrfs is possible: plain directories on any filesystem. Every
 * copy (new workspace, snapshot, restore, fork) is `cp -a --reflink=auto`, so its cost grows
 * with the number and size of files (a reflinking filesystem such as XFS shares the data blocks).
 * Snapshots are read-only by convention: they live in a root-only area no sandbox can see.
 * Quotas are not available: asking for them is refused at start, and `quotaStatus` carries a
 * `quotas_unavailable` warning (logged at start, shown by `GET /v1/runtime`): one session can fill
 * the filesystem that holds the store.
 */
export class DirPool extends PoolLayout implements StoragePool {
  readonly driver = 'dir'
  readonly capabilities = { quotas: false, constantTimeCopies: false }
  // The marker xattrs need no btrfs: the same helper reads and writes them on any filesystem
  // with trusted.* attributes (ext4, XFS, tmpfs, btrfs). `cp -a` copies them with the tree.
  private readonly markers = new BtrfsOps(1)

  constructor(private readonly options: DirPoolOptions) {
    super(options)
  }

  quotaStatus(): PoolQuotaStatus {
    return {
      enforced: false,
      warning: {
        code: 'quotas_unavailable',
        message:
          'the dir storage driver cannot limit workspaces or tenants: one session can fill the filesystem that holds the pool, failing every other session and Cairn writes there; use the btrfs driver for quotas',
      },
    }
  }

  /** Without quota groups nothing measures a tenant cheaply (a walk of every tree would). */
  async tenantUsage(_tenantIds: string[]): Promise<Map<string, TreeSizes>> {
    return new Map()
  }

  describe(): string {
    return `directory pool at ${this.options.storePath} (copies with cp -a --reflink=auto)`
  }

  async open(): Promise<void> {
    const { mountPoint, storePath, workspaceQuotaBytes, tenantQuotaBytes } = this.options
    if (workspaceQuotaBytes || tenantQuotaBytes) {
      throw new CairnProblem(
        'unavailable',
        'workspace quotas need the btrfs storage driver; the dir driver cannot limit a workspace',
      )
    }
    await mkdir(storePath, { recursive: true })
    await mkdir(mountPoint, { recursive: true })
    // Sandboxes run as an unprivileged uid that must reach its workspace, and the store may sit in
    // a private data dir: the bind mount under the instance's run dir is the path they use.
    if (!findMount(mountPoint)) {
      await execTool('mount', ['--bind', storePath, mountPoint], { code: 'storage_error' })
      this.mountedHere = true
    }
    await chmod(mountPoint, 0o711)
    for (const area of POOL_AREAS) {
      const dir = this.areaDir(area)
      await mkdir(dir, { recursive: true })
      // No sandbox ever needs the snapshots area: root only, which is what keeps them read-only.
      await chmod(dir, area === 'snapshots' ? 0o700 : 0o711)
      // A copy a crash interrupted is incomplete: drop it.
      for (const name of await readdir(dir)) {
        if (name.startsWith('.') && name.endsWith(COPYING)) await this.removeTree(path.join(dir, name))
      }
    }
  }

  async close(): Promise<void> {
    this.markers.close()
    await this.unmount()
  }

  async createStaging(name: string): Promise<string> {
    const dir = path.join(this.areaDir('staging'), safeName(name))
    await this.removeTree(dir)
    await mkdir(dir)
    return dir
  }

  async sealRevision(stagingDir: string, revisionId: string): Promise<string> {
    const target = this.revisionPath(revisionId)
    await this.handToSandbox(stagingDir)
    await rename(stagingDir, target)
    return target
  }

  async sealStaging(stagingDir: string, target: string): Promise<void> {
    await rename(stagingDir, target)
  }

  /** No quota groups here: an image's tree is staged and sealed like any other. */
  createImageStaging(name: string): Promise<string> {
    return this.createStaging(name)
  }

  sealImageStaging(stagingDir: string, target: string): Promise<void> {
    return this.sealStaging(stagingDir, target)
  }

  async imagesUsage(): Promise<undefined> {
    return undefined
  }

  async discardStaging(stagingDir: string): Promise<void> {
    await this.removeTree(stagingDir)
  }

  async deleteRevision(revisionId: string): Promise<void> {
    await this.removeTree(this.revisionPath(revisionId))
  }

  async createWorkspace(sessionId: string, revisionId: string): Promise<string> {
    const target = this.newWorkspacePath(sessionId)
    await copyTree(this.revisionPath(revisionId), target)
    await this.markers.setGeneration(target, 0)
    return target
  }

  async readGenerations(sessionIds: string[]): Promise<(number | undefined)[]> {
    return this.markers.getGenerations(sessionIds.map((id) => this.workspacePath(id)))
  }

  async deleteWorkspace(sessionId: string): Promise<void> {
    await this.removeTree(this.workspacePath(sessionId))
  }

  async createWorkspaceStaging(name: string): Promise<string> {
    const dir = await this.createStaging(name)
    await this.chownToSandbox(dir)
    await chmod(dir, 0o700)
    return dir
  }

  async snapshotWorkspace(sessionId: string, snapshotId: string): Promise<number | undefined> {
    await copyTree(this.workspacePath(sessionId), this.snapshotPath(snapshotId))
    return undefined
  }

  /** Plain directories have no cheap change counter: every automatic snapshot is taken. */
  async workspaceMark(_sessionId: string): Promise<number | undefined> {
    return undefined
  }

  async restoreWorkspace(sessionId: string, snapshotId: string, generation?: number): Promise<void> {
    const source = this.snapshotPath(snapshotId)
    await this.swapWorkspace(sessionId, (incoming) => copyTree(source, incoming), generation)
  }

  async forkWorkspace(sessionId: string, snapshotId: string): Promise<string> {
    const target = this.newWorkspacePath(sessionId)
    await copyTree(this.snapshotPath(snapshotId), target)
    return target
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.removeTree(this.snapshotPath(snapshotId))
  }

  /**
   * The blocks a `du -s` walk finds (allocated bytes, O(files)). Copies share no blocks that can
   * be told apart here, so referenced and exclusive are the same figure; on a filesystem where
   * `cp --reflink` did share extents (XFS, btrfs used as a plain directory) exclusive overstates.
   */
  async usage(dir: string): Promise<TreeSizes> {
    const { stdout } = await execTool('du', ['-s', '-B1', '--', dir], { code: 'storage_error' })
    const bytes = Number(stdout.trim().split(/\s+/)[0] ?? 0)
    return { referencedBytes: bytes, exclusiveBytes: bytes }
  }

  protected async removeTree(dir: string): Promise<void> {
    await removeTree(dir)
  }

  protected async setGenerationMarker(dir: string, generation: number): Promise<void> {
    await this.markers.setGeneration(dir, generation)
  }
}

/**
 * Copies a tree exactly (modes, owners, times, links as links) under a hidden name, then renames
 * it into place: a crash mid-copy never leaves a partial tree under the real name.
 */
async function copyTree(source: string, target: string): Promise<void> {
  const temp = path.join(path.dirname(target), `.${path.basename(target)}${COPYING}`)
  await removeTree(temp)
  try {
    await execTool('cp', ['-a', '--reflink=auto', '--no-target-directory', '--', source, temp], {
      code: 'storage_error',
    })
    await rename(temp, target)
  } catch (error) {
    await removeTree(temp)
    throw error
  }
}
