import { existsSync } from 'node:fs'
import type { Readable } from 'node:stream'
import type { FileEntry, WorkspaceDiff } from '@cairn/protocol'
import type { Runtime } from '../runtime.js'
import type { IsolationName } from '../sandbox/driver.js'
import type { PoolArea, PoolQuotaStatus, PoolStats, TreeSizes } from '../storage/pool.js'
import { treeDigest } from '../workspace-io/digest.js'
import { exportTree } from '../workspace-io/export-tree.js'
import { openTreeFile } from '../workspace-io/reader.js'
import { diffTrees, listDirectory, pathExists } from '../workspace-io/tree.js'
import type { RevisionStaging } from './revision-staging.js'
import type { RuntimeDescription, SandboxDriverFacts, TreeReadOptions, TreeRef } from './runtime-port.js'

/**
 * The part of `LocalRuntimePort` that reads and keeps the pool's trees by ID and describes this
 * node, with no sandbox involved: workspaces created and forked, generations, usage and quotas,
 * and the files of any tree (a workspace, a snapshot, a revision, a revision being deployed).
 * What runs in sandboxes, or must wait for them, is `LocalRuntimePort`'s own.
 */
export abstract class LocalPoolPort {
  /** Revisions being deployed: their staging trees are trees too. */
  protected abstract readonly revisions: RevisionStaging

  constructor(protected readonly runtime: Runtime) {}

  async createWorkspace(sessionId: string, revisionId: string, tenantId: string): Promise<void> {
    await this.runtime.pool.createWorkspace(sessionId, revisionId, tenantId)
  }

  hasWorkspace(sessionId: string): Promise<boolean> {
    return this.runtime.pool.hasWorkspace(sessionId)
  }

  async forkWorkspace(childId: string, snapshotId: string, tenantId: string): Promise<void> {
    await this.runtime.pool.forkWorkspace(childId, snapshotId, tenantId)
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
    const { capabilities, capabilityReasons } = this.runtime.capabilitiesOf(driver)
    return {
      name: driver.name,
      capabilities,
      ...(capabilityReasons ? { unavailableBecause: capabilityReasons } : {}),
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
  protected path(tree: TreeRef): string {
    const { pool } = this.runtime
    if ('sessionId' in tree) return pool.workspacePath(tree.sessionId)
    if ('snapshotId' in tree) return pool.snapshotPath(tree.snapshotId)
    if ('stagedRevisionId' in tree) return this.revisions.stagingOf(tree.stagedRevisionId)
    return pool.revisionPath(tree.revisionId)
  }

  async hasTree(tree: TreeRef): Promise<boolean> {
    if ('stagedRevisionId' in tree && !this.revisions.has(tree.stagedRevisionId)) return false
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
}
