import {
  type AgentDetail,
  type AgentInfo,
  type AgentManifest,
  CairnProblem,
  type DeployResult,
  type NetworkPolicy,
  newId,
  type RevisionInfo,
} from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import { Redactor } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import { type Db, isUniqueViolation } from '../db/database.js'
import { ImageService, type ImageSettings, type ResolvedImage } from '../images/image-service.js'
import { checkManifestCeilings } from '../limits/ceilings.js'
import { type OperatorLimits, operatorLimitSource } from '../limits/operator-limits.js'
import { TenantSlots } from '../limits/tenant-slots.js'
import { checkPausePolicy } from '../pause/pause-policy.js'
import { assertBindingsAllowed, unreachableBindings } from '../secrets/proxy-bindings.js'
import type { SecretStore } from '../secrets/secret-store.js'
import { type AgentRow, AgentStore, type StoredRevision } from './agent-store.js'
import { type ArchiveLimits, DEFAULT_ARCHIVE_LIMITS, inspectArchive } from './archive.js'
import type { BuildLogs } from './build-logs.js'
import { type BuildPlan, planBuild } from './build-plan.js'
import { Builder, type BuilderOptions } from './builder.js'
import { hashWithManifest, readManifest, splitCommand, withManifest } from './manifest.js'
import { stagedProject } from './project-files.js'

export interface AgentServiceDeps {
  db: Db
  /** Stages, builds and seals revisions and builds images, by revision ID and key. */
  runtime: RuntimePort
  secrets: SecretStore
  logs: BuildLogs
  buildTimeoutMs?: number
  clock: Clock
  logger: Logger
  archiveLimits?: ArchiveLimits
  /** How revision builds reach the network (the operator's egress settings and registries). */
  build?: BuilderOptions | undefined
  /** The operator's maxima: a manifest asking for more is refused (`limit_above_ceiling`). */
  operatorLimits: OperatorLimits
  /** The default image and where images come from. */
  images?: ImageSettings | undefined
}

/** Whether a revision has a build to run: dependencies, a setup command or an image to make. */
function needsBuild(plan: BuildPlan): boolean {
  return Boolean(plan.dependencies || plan.setup || plan.image)
}

export function revisionInfo(revision: StoredRevision): RevisionInfo {
  const { manifest: _manifest, ...info } = revision
  return info
}

/** Deploys project archives as revisions and answers questions about agents. */
export class AgentService {
  readonly store: AgentStore
  readonly logs: BuildLogs
  private readonly builder: Builder
  readonly images: ImageService

  /** Builds running per tenant (each is a sandbox with the build's limits). */
  private readonly builds: TenantSlots

  constructor(private readonly deps: AgentServiceDeps) {
    this.builds = new TenantSlots(
      'builds',
      { name: 'maxBuildsPerTenant', source: operatorLimitSource('maxBuildsPerTenant') },
      () => deps.operatorLimits.maxBuildsPerTenant,
    )
    this.store = new AgentStore(deps.db)
    this.images = new ImageService({
      db: deps.db,
      runtime: deps.runtime,
      logger: deps.logger,
      ...deps.images,
    })
    this.builder = new Builder(deps.runtime, deps.build ?? {}, this.images)
    this.logs = deps.logs
  }

  /**
   * Checks and unpacks the archive, records a DEPLOYING revision and builds it. Without
   * dependencies or setup the revision is READY when this returns; otherwise the build runs in the
   * background (logs at `…/revisions/{rev}/logs`) unless `wait` is set.
   */
  async deploy(
    tenantId: string,
    archive: Buffer,
    options: {
      name?: string
      wait?: boolean
      /**
       * A cairn.yaml given beside the archive (a translated deploy's, see compat/deploy.ts): it
       * wins over the project's own and is part of the revision's content hash.
       */
      manifest?: string
    } = {},
  ): Promise<DeployResult> {
    const inspected = await inspectArchive(archive, this.deps.archiveLimits ?? DEFAULT_ARCHIVE_LIMITS)
    const summary =
      options.manifest === undefined
        ? inspected
        : { ...inspected, contentHash: hashWithManifest(inspected.contentHash, options.manifest) }
    const { runtime } = this.deps
    const revisionId = newId('revision')
    let agentId: string | undefined
    let plan: BuildPlan
    let image: ResolvedImage
    let manifest: AgentManifest
    let buildSlot: () => void = () => undefined
    let imageHeld: () => void = () => undefined
    try {
      await runtime.stageRevision(revisionId, tenantId, archive)
      const staged = stagedProject(runtime, revisionId)
      const project = options.manifest === undefined ? staged : withManifest(staged, options.manifest)
      const resolved = await readManifest(project, options.name)
      manifest = resolved.manifest
      checkManifestCeilings(resolved.manifest, this.deps.operatorLimits)
      await checkPausePolicy(resolved.manifest, this.deps.runtime)
      const setup = resolved.manifest.setup
      plan = await planBuild(tenantId, project, typeof setup === 'string' ? splitCommand(setup) : setup)
      // The image's key now (an OCI tag resolved to its digest): the revision records which it runs on.
      image = await this.images.resolve(resolved.manifest, {
        log: (line) => this.deps.logger.debug({ revision: revisionId }, line),
        timeoutMs: 60_000,
      })
      // Before the build starts: a tenant past its distinct images is refused with nothing built.
      imageHeld = await this.images.admit(tenantId, image)
      plan = { ...plan, image: (await this.images.needsBuild(image)) ? image : undefined }
      // Before anything is recorded: a deploy past the tenant's concurrent builds leaves no trace.
      if (needsBuild(plan)) buildSlot = this.builds.take(tenantId)
      const at = iso(this.deps.clock.now())
      // A first deploy of one name racing another on PostgreSQL: the unique name refuses the
      // second insert, which then finds the agent the first one made.
      agentId = await retryOnUniqueViolation(() =>
        this.deps.db.transaction(async () => {
          const existing = await this.store.find(tenantId, resolved.name)
          if (existing) {
            // Like any other manifest error: no revision is recorded.
            const proxied = (await this.deps.secrets.list(existing.id)).filter((s) => s.scope === 'proxy')
            assertBindingsAllowed(
              'invalid_manifest',
              unreachableBindings(proxied, resolved.manifest.network),
              `cairn.yaml's network.allow`,
            )
          }
          const id = existing?.id ?? newId('agent')
          if (!existing) await this.store.insertAgent(id, tenantId, resolved.name, at)
          await this.store.insertRevision({
            id: revisionId,
            agent_id: id,
            tenant_id: tenantId,
            status: 'DEPLOYING',
            content_hash: summary.contentHash,
            manifest_json: JSON.stringify({
              ...resolved.manifest,
              resolvedCommand: resolved.command,
              envKey: plan.dependencies?.envKey ?? null,
              imageKey: image.key ?? null,
            }),
            file_count: summary.fileCount,
            size_bytes: summary.sizeBytes,
            error: null,
            created_at: at,
          })
          return id
        }),
      )
      imageHeld()
    } catch (error) {
      buildSlot()
      imageHeld()
      // The deploy's own error is the one to answer; a staging tree left behind is reported here.
      await runtime
        .discardStagedRevision(revisionId)
        .catch((discardError: unknown) =>
          this.deps.logger.warn(
            { err: discardError, revision: revisionId },
            "discarding a failed deploy's staging tree failed",
          ),
        )
      throw error
    }
    const id = agentId
    const finish = this.finishBuild(tenantId, id, revisionId, plan, manifest, image).finally(buildSlot)
    if (options.wait || !needsBuild(plan)) await finish
    // Not awaited: finishBuild records its own failures on the revision; what escapes that is logged.
    else
      finish.catch((error: unknown) =>
        this.deps.logger.error({ err: error, agent: id, revision: revisionId }, 'finishing a build failed'),
      )
    const agent = await this.store.find(tenantId, id)
    const revision = await this.store.revision(revisionId)
    if (!agent || !revision) throw new CairnProblem('internal', 'deployed agent vanished')
    if (revision.status === 'FAILED' && !needsBuild(plan)) {
      throw new CairnProblem('build_failed', revision.error ?? 'the revision could not be sealed')
    }
    return { agent: await this.store.toInfo(agent), revision: revisionInfo(revision) }
  }

  private async finishBuild(
    tenantId: string,
    agentId: string,
    revisionId: string,
    plan: BuildPlan,
    manifest: AgentManifest,
    image: ResolvedImage,
  ) {
    const { runtime } = this.deps
    const { logs } = this
    const building = needsBuild(plan)
    // Live before anything is awaited: the deploy that started this build answers once this
    // first await yields, and a follower that comes at once must find the log live.
    if (building) logs.open(revisionId)
    let secrets: Record<string, string> = {}
    let redactor = new Redactor(secrets)
    const log = (line: string) => logs.append(revisionId, redactor.redact(line))
    try {
      secrets = await this.deps.secrets.valuesForScope(tenantId, agentId, 'setup')
      redactor = new Redactor(secrets)
      if (building) {
        const started = performance.now()
        const result = await this.builder.build({
          image,
          revisionId,
          tenantId,
          plan,
          setupEnv: secrets,
          log,
          timeoutMs: this.deps.buildTimeoutMs ?? 15 * 60 * 1000,
          network: manifest.network,
          isolation: manifest.isolation,
        })
        log(
          `build finished in ${Math.round(performance.now() - started)} ms${result.reusedEnv ? ' (environment reused)' : ''}`,
        )
      }
      await runtime.sealRevision(revisionId, tenantId)
      const current = await this.deps.db.transaction(async () => {
        await this.store.setRevisionStatus(revisionId, 'READY', null)
        return this.promote(agentId, revisionId)
      })
      if (building) await logs.close(revisionId, 'READY')
      this.deps.logger.info(
        { agent: agentId, revision: revisionId, tenant: tenantId, current },
        'revision ready',
      )
    } catch (error) {
      // The revision is marked FAILED below either way; a staging tree left behind is reported.
      await runtime
        .discardStagedRevision(revisionId)
        .catch((discardError: unknown) =>
          this.deps.logger.warn(
            { err: discardError, revision: revisionId },
            "discarding a failed build's staging tree failed",
          ),
        )
      const lines = await logs.read(revisionId)
      const message = redactor.redact((error as Error).message)
      const tail = lines.slice(-15).join('\n')
      await this.store.setRevisionStatus(revisionId, 'FAILED', tail ? `${message}\n${tail}` : message)
      if (building) {
        log(`build failed: ${message}`)
        await logs.close(revisionId, 'FAILED', message)
      }
      this.deps.logger.warn({ agent: agentId, revision: revisionId, err: message }, 'revision failed')
    }
  }

  /** A READY revision becomes current unless a newer deploy's already is (see promoteFinishedRevision). */
  private async promote(agentId: string, revisionId: string): Promise<boolean> {
    const revision = await this.store.revision(revisionId)
    if (!revision) throw new CairnProblem('internal', `revision ${revisionId} vanished`)
    return this.store.promoteFinishedRevision(agentId, revision, iso(this.deps.clock.now()))
  }

  async revisionOf(tenantId: string, idOrName: string, revisionId: string): Promise<StoredRevision> {
    const agent = await this.require(tenantId, idOrName)
    const revision = await this.store.revision(revisionId)
    if (!revision || revision.agentId !== agent.id) {
      throw new CairnProblem('revision_not_found', `No revision ${revisionId} for agent '${agent.name}'`)
    }
    return revision
  }

  async require(tenantId: string, idOrName: string): Promise<AgentRow> {
    const agent = await this.store.find(tenantId, idOrName)
    if (!agent) throw new CairnProblem('agent_not_found', `No agent found matching '${idOrName}'`)
    return agent
  }

  async list(tenantId: string): Promise<AgentInfo[]> {
    return Promise.all((await this.store.list(tenantId)).map((row) => this.store.toInfo(row)))
  }

  async get(tenantId: string, idOrName: string): Promise<AgentDetail> {
    const agent = await this.require(tenantId, idOrName)
    return {
      ...(await this.store.toInfo(agent)),
      revisions: (await this.store.revisions(agent.id)).map(revisionInfo),
    }
  }

  /** Secret names the agent's current revision declares in `cairn.yaml`. */
  async requiredSecrets(agentId: string): Promise<string[]> {
    const row = await this.store.byId(agentId)
    const revision = row?.current_revision_id ? await this.store.revision(row.current_revision_id) : undefined
    return revision?.manifest.secrets ?? []
  }

  /** The `network` of the agent's current revision's cairn.yaml; undefined without a current revision. */
  async currentNetwork(
    agentId: string,
  ): Promise<{ revisionId: string; network: NetworkPolicy | undefined } | undefined> {
    const row = await this.store.byId(agentId)
    const revision = row?.current_revision_id ? await this.store.revision(row.current_revision_id) : undefined
    return revision && { revisionId: revision.id, network: revision.manifest.network }
  }

  async delete(tenantId: string, idOrName: string): Promise<void> {
    const agent = await this.require(tenantId, idOrName)
    await this.store.softDelete(agent.id, iso(this.deps.clock.now()))
  }
}

/** Runs `write` again, once, when a unique constraint refused it (a concurrent writer won a race). */
async function retryOnUniqueViolation<T>(write: () => Promise<T>): Promise<T> {
  try {
    return await write()
  } catch (error) {
    if (!isUniqueViolation(error)) throw error
    return write()
  }
}
