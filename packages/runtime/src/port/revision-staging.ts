import { CairnProblem } from '@cairn/protocol'
import { extractArchive } from '../build/extract-archive.js'
import type { RevisionBuild, RevisionBuilder, RevisionBuildResult } from '../build/revision-builder.js'
import type { Runtime } from '../runtime.js'

/**
 * Revisions being deployed on this node: each unpacked into a staging tree of the pool, built
 * there, then sealed as the revision (or discarded). See `RuntimePort.stageRevision`.
 */
export class RevisionStaging {
  /** Staging trees of revisions being deployed, by revision ID. */
  private readonly staged = new Map<string, string>()

  constructor(
    private readonly runtime: Runtime,
    private readonly builder: RevisionBuilder,
  ) {}

  has(revisionId: string): boolean {
    return this.staged.has(revisionId)
  }

  /** The staging tree of a revision being deployed (`not_found` for any other). */
  stagingOf(revisionId: string): string {
    const staging = this.staged.get(revisionId)
    if (!staging) throw new CairnProblem('not_found', `revision ${revisionId} is not being deployed`)
    return staging
  }

  async stage(revisionId: string, tenantId: string, archive: Buffer): Promise<void> {
    if (this.staged.has(revisionId))
      throw new CairnProblem('conflict', `revision ${revisionId} is staged already`)
    const staging = await this.runtime.pool.createStaging(revisionId, tenantId)
    this.staged.set(revisionId, staging)
    try {
      await extractArchive(archive, staging)
    } catch (error) {
      await this.discard(revisionId).catch((discardError: unknown) =>
        this.runtime.logger.warn({ err: discardError, staging }, "discarding a deploy's staging tree failed"),
      )
      throw error
    }
  }

  async build(build: RevisionBuild, onLog: (line: string) => void): Promise<RevisionBuildResult> {
    return this.builder.build(build, this.stagingOf(build.revisionId), onLog)
  }

  async seal(revisionId: string, tenantId: string): Promise<void> {
    await this.runtime.pool.sealRevision(this.stagingOf(revisionId), revisionId, tenantId)
    this.staged.delete(revisionId)
  }

  async discard(revisionId: string): Promise<void> {
    const staging = this.staged.get(revisionId)
    if (!staging) return
    await this.runtime.pool.discardStaging(staging)
    this.staged.delete(revisionId)
  }
}
