import type { AgentManifest, ImageInfo, ImageList } from '@cairn/protocol'
import { CairnProblem } from '@cairn/protocol'
import {
  describeRecipe,
  HOST_IMAGE,
  type ImageBuildContext,
  type ImageRecipe,
  parseImage,
  type RuntimePort,
} from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { Db } from '../db/database.js'

export interface ImageSettings {
  /** The image of agents whose cairn.yaml names none (`host`, `debian:bookworm`, an OCI reference). */
  defaultImage?: string | undefined
  /** The Debian mirror images are built from. */
  debianMirror?: string | undefined
  /** Distinct images one tenant's live revisions may run on (default 8). */
  maxImagesPerTenant?: number | undefined
}

export interface ImageServiceDeps extends ImageSettings {
  db: Db
  /** Builds, pulls, lists and removes images (the runtime's egress settings and size cap apply). */
  runtime: Pick<
    RuntimePort,
    'imageKeyOf' | 'hasImage' | 'ensureImage' | 'image' | 'listImages' | 'removeImage'
  >
  logger: Logger
}

interface UsageRow {
  id: string
  agent_id: string
  tenant_id: string
  manifest_json: string
}

/** The image a revision's sandboxes run on, as deploy resolved it. */
export interface ResolvedImage {
  recipe: ImageRecipe
  /** Undefined for the host's /usr. */
  key: string | undefined
}

/**
 * Agent images: which one a manifest names (or the operator's default), building and pulling them
 * at deploy (by the runtime, through its port), the key a revision's sandboxes run on, listing them
 * and collecting unused ones.
 */
export class ImageService {
  readonly defaultImage: string
  private readonly mirror: string
  /** Per tenant, the image keys of deploys admitted and not yet recorded (counted with the recorded ones). */
  private readonly pending = new Map<string, string[]>()

  constructor(private readonly deps: ImageServiceDeps) {
    this.defaultImage = deps.defaultImage ?? HOST_IMAGE
    this.mirror = deps.debianMirror ?? 'http://deb.debian.org/debian'
    // A default that cannot be parsed is the operator's mistake: refused at start, not at each deploy.
    parseImage(this.defaultImage, undefined, this.mirror)
  }

  /** The recipe of a manifest's `image:` and `packages:` (the default image when it names none). */
  recipeOf(manifest: Pick<AgentManifest, 'image' | 'packages'>): ImageRecipe {
    return parseImage(manifest.image ?? this.defaultImage, manifest.packages, this.mirror)
  }

  /** The recipe and key a deploy records (an OCI tag is resolved to its digest now). */
  async resolve(
    manifest: Pick<AgentManifest, 'image' | 'packages'>,
    ctx: ImageBuildContext,
  ): Promise<ResolvedImage> {
    const recipe = this.recipeOf(manifest)
    return { recipe, key: await this.deps.runtime.imageKeyOf(recipe, ctx) }
  }

  /**
   * Admits a deploy's image before anything is built: refused (`409 image_limit_reached`) when it
   * is new to the tenant and the tenant's live revisions, with its deploys under way, already run
   * on as many distinct images as it may. The key stays counted until `release` (called once the
   * revision is recorded or the deploy failed), so concurrent deploys cannot each pass.
   */
  async admit(tenantId: string, image: ResolvedImage): Promise<() => void> {
    const key = image.key
    if (!key) return () => undefined
    const keys = await this.tenantKeys(tenantId)
    const pending = this.pending.get(tenantId) ?? []
    for (const held of pending) keys.add(held)
    const max = this.maxImagesPerTenant
    if (!keys.has(key) && keys.size >= max)
      throw new CairnProblem(
        'image_limit_reached',
        `this tenant's revisions run on ${keys.size} distinct images, the operator's maximum (--max-images-per-tenant ${max}); delete agents whose images are no longer needed`,
        { maxImages: max },
      )
    pending.push(key)
    this.pending.set(tenantId, pending)
    let released = false
    return () => {
      if (released) return
      released = true
      pending.splice(pending.indexOf(key), 1)
      if (pending.length === 0 && this.pending.get(tenantId) === pending) this.pending.delete(tenantId)
    }
  }

  private get maxImagesPerTenant(): number {
    return this.deps.maxImagesPerTenant ?? 8
  }

  /** The keys of the images the tenant's live revisions run on. */
  private async tenantKeys(tenantId: string): Promise<Set<string>> {
    const keys = new Set<string>()
    for (const [used, rows] of await this.usage())
      if (rows.some((row) => row.tenant_id === tenantId)) keys.add(used)
    return keys
  }

  /** What `GET /v1/usage` reports: the distinct images the tenant's live revisions run on, and its allowance. */
  async tenantImages(tenantId: string): Promise<{ count: number; maxImages: number }> {
    return { count: (await this.tenantKeys(tenantId)).size, maxImages: this.maxImagesPerTenant }
  }

  /** Whether the revision's build must build or pull its image first. */
  async needsBuild(image: ResolvedImage | undefined): Promise<boolean> {
    return image?.key !== undefined && !(await this.deps.runtime.hasImage(image.key))
  }

  /** Builds or pulls the image (a no-op when it is there). */
  async ensure(image: ResolvedImage, ctx: ImageBuildContext): Promise<void> {
    if (image.key) await this.deps.runtime.ensureImage(image.recipe, image.key, ctx)
  }

  /** The image a revision's sandboxes run on, by key; undefined: the host's /usr. */
  imageKeyOf(
    revision: { manifest: { imageKey?: string | null | undefined } } | undefined,
  ): string | undefined {
    return revision?.manifest.imageKey ?? undefined
  }

  /** What the session manifest names as the base image. */
  async describe(imageKey: string | null | undefined): Promise<string> {
    if (!imageKey) return 'host /usr, read-only'
    const record = await this.deps.runtime.image(imageKey)
    return record ? `${record.source} (${record.digest})` : `${imageKey} (removed)`
  }

  /**
   * Revisions whose sandboxes run on an image: every one not FAILED, of an agent not deleted or
   * with a session not deleted (a deleted agent's sessions may still run).
   */
  private async usage(): Promise<Map<string, UsageRow[]>> {
    const rows = (await this.deps.db.q
      .selectFrom('revisions as r')
      .innerJoin('agents as a', 'a.id', 'r.agent_id')
      .select(['r.id', 'r.agent_id', 'r.tenant_id', 'r.manifest_json'])
      .where('r.status', '!=', 'FAILED')
      .where('r.manifest_json', 'like', '%"imageKey":"%')
      .where((eb) =>
        eb.or([
          eb('a.deleted_at', 'is', null),
          eb.exists(
            eb
              .selectFrom('sessions as s')
              .select('s.id')
              .whereRef('s.revision_id', '=', 'r.id')
              .where('s.status', '!=', 'deleted'),
          ),
        ]),
      )
      .execute()) as UsageRow[]
    const byKey = new Map<string, UsageRow[]>()
    for (const row of rows) {
      const key = (JSON.parse(row.manifest_json) as { imageKey?: string | null }).imageKey
      if (!key) continue
      byKey.set(key, [...(byKey.get(key) ?? []), row])
    }
    return byKey
  }

  /**
   * The built images the tenant's revisions run on, with those revisions. Images are shared by key
   * across tenants: one another tenant pulled (its registry, its digest) is not listed.
   */
  async list(tenantId: string): Promise<ImageList> {
    const usage = await this.usage()
    const data: ImageInfo[] = (await this.deps.runtime.listImages())
      .map((record) => ({
        ...record,
        revisions: (usage.get(record.key) ?? [])
          .filter((row) => row.tenant_id === tenantId)
          .map((row) => ({ id: row.id, agentId: row.agent_id })),
      }))
      .filter((image) => image.revisions.length > 0)
    return { data, defaultImage: this.defaultImage }
  }

  /** Removes the images no revision uses (retention); returns how many and the bytes freed. */
  async collect(): Promise<{ images: number; bytesFreed: number }> {
    const usage = await this.usage()
    const result = { images: 0, bytesFreed: 0 }
    for (const record of await this.deps.runtime.listImages()) {
      // Asked again just before: a deploy may have named it while the listing was read.
      if (usage.has(record.key) || (await this.usage()).has(record.key)) continue
      try {
        await this.deps.runtime.removeImage(record.key)
      } catch (error) {
        // Still mounted by a sandbox that outlived its agent's deletion: the next pass tries again.
        this.deps.logger.warn({ err: error, image: record.key }, 'could not remove an unused image')
        continue
      }
      result.images++
      result.bytesFreed += record.sizeBytes
    }
    if (result.images > 0) this.deps.logger.info(result, 'unused images removed')
    return result
  }

  describeRecipe(recipe: ImageRecipe): string {
    return describeRecipe(recipe)
  }
}
