import type { AgentManifest, ImageInfo, ImageList } from '@cairn/protocol'
import {
  DEFAULT_SANDBOX_UID,
  describeRecipe,
  type EgressSite,
  HOST_IMAGE,
  type ImageBuildContext,
  ImageBuilder,
  type ImageRecipe,
  ImageStore,
  parseImage,
  type Runtime,
} from '@cairn/runtime'
import type { Logger } from 'pino'
import type { Db } from '../db/database.js'

export interface ImageSettings {
  /** The image of agents whose cairn.yaml names none (`host`, `debian:bookworm`, an OCI reference). */
  defaultImage?: string | undefined
  /** The Debian mirror images are built from. */
  debianMirror?: string | undefined
  /** The operator's egress settings: builds and pulls go out through the egress proxy. */
  egressSite?: EgressSite | undefined
  /** Largest image root a build or pull may leave (its staging tree is discarded beyond). */
  maxImageBytes?: number | undefined
}

export interface ImageServiceDeps extends ImageSettings {
  db: Db
  runtime: Runtime
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
 * at deploy, the root a revision's sandboxes get, listing them and collecting unused ones.
 */
export class ImageService {
  readonly store: ImageStore
  private readonly builder: ImageBuilder
  readonly defaultImage: string
  private readonly mirror: string

  constructor(private readonly deps: ImageServiceDeps) {
    this.store = new ImageStore(deps.runtime.pool)
    const uid = deps.runtime.options.sandboxUid ?? DEFAULT_SANDBOX_UID
    this.builder = new ImageBuilder({
      store: this.store,
      hostUid: uid,
      hostGid: uid,
      egressSite: deps.egressSite,
      maxBytes: deps.maxImageBytes,
    })
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
    return { recipe, key: await this.builder.keyOf(recipe, ctx) }
  }

  /** Whether the revision's build must build or pull its image first. */
  needsBuild(image: ResolvedImage | undefined): boolean {
    return image?.key !== undefined && !this.store.has(image.key)
  }

  /** Builds or pulls the image (a no-op when it is there). */
  async ensure(image: ResolvedImage, ctx: ImageBuildContext): Promise<void> {
    if (image.key) await this.builder.ensure(image.recipe, image.key, ctx)
  }

  /** The root filesystem of a revision's sandboxes; undefined: the host's /usr. */
  rootfsOf(revision: { manifest: { imageKey?: string | null | undefined } } | undefined): string | undefined {
    const key = revision?.manifest.imageKey
    return key ? this.store.rootfsPath(key) : undefined
  }

  /** What the session manifest names as the base image. */
  async describe(imageKey: string | null | undefined): Promise<string> {
    if (!imageKey) return 'host /usr, read-only'
    const record = await this.store.get(imageKey)
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

  /** Built images with the tenant's revisions that use them. */
  async list(tenantId: string): Promise<ImageList> {
    const usage = await this.usage()
    const data: ImageInfo[] = (await this.store.list()).map((record) => ({
      ...record,
      revisions: (usage.get(record.key) ?? [])
        .filter((row) => row.tenant_id === tenantId)
        .map((row) => ({ id: row.id, agentId: row.agent_id })),
    }))
    return { data, defaultImage: this.defaultImage }
  }

  /** Removes the images no revision uses (retention); returns how many and the bytes freed. */
  async collect(): Promise<{ images: number; bytesFreed: number }> {
    const usage = await this.usage()
    const result = { images: 0, bytesFreed: 0 }
    for (const record of await this.store.list()) {
      // Asked again just before: a deploy may have named it while the listing was read.
      if (usage.has(record.key) || (await this.usage()).has(record.key)) continue
      try {
        await this.store.remove(record.key)
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
