import type { NetworkPolicy } from '@cairn/protocol'
import type { IsolationName, RevisionBuildResult, RuntimePort } from '@cairn/runtime/port'
import type { ImageService, ResolvedImage } from '../images/image-service.js'
import type { BuildPlan } from './build-plan.js'
import { hostRegistries } from './build-registries.js'

export interface BuildContext {
  revisionId: string
  tenantId: string
  /** The image the revision's sandboxes (and so its build steps) run on. */
  image: ResolvedImage
  plan: BuildPlan
  /** Secrets of scope `setup`, as environment variables of the build. */
  setupEnv: Record<string, string>
  log: (line: string) => void
  timeoutMs: number
  /** The agent's `network` from cairn.yaml: the build may reach these hosts too. */
  network: NetworkPolicy | undefined
  /** The agent's sandbox driver: its build runs under the same one. */
  isolation: IsolationName | undefined
}

export interface BuilderOptions {
  /**
   * Hosts every build may reach besides the agent's allowlist (package registries); undefined:
   * the registries npm and pip are configured with on this host, looked up at the first build.
   */
  buildEgressAllow?: readonly string[] | undefined
}

/**
 * Builds a staged revision through the runtime's port: its image first (built or pulled when
 * missing), then its dependency environment and setup command, in sandboxes that may reach the
 * agent's allowlist and the package registries.
 */
export class Builder {
  private registries: Promise<readonly string[]> | undefined

  constructor(
    private readonly runtime: Pick<RuntimePort, 'buildRevision'>,
    private readonly options: BuilderOptions,
    private readonly images: ImageService,
  ) {}

  /** What a build may reach: the agent's allowlist plus the operator's registries. */
  private async egressAllow(ctx: BuildContext): Promise<NetworkPolicy['allow']> {
    this.registries ??= this.options.buildEgressAllow
      ? Promise.resolve(this.options.buildEgressAllow)
      : hostRegistries()
    return [...(ctx.network?.allow ?? []), ...(await this.registries)]
  }

  async build(ctx: BuildContext): Promise<RevisionBuildResult> {
    // First the image: the dependency environment and the setup command run on it.
    if (ctx.plan.image) await this.images.ensure(ctx.plan.image, { log: ctx.log, timeoutMs: ctx.timeoutMs })
    const deps = ctx.plan.dependencies
    return this.runtime.buildRevision(
      {
        revisionId: ctx.revisionId,
        tenantId: ctx.tenantId,
        imageKey: ctx.image.key,
        dependencies: deps && {
          envKey: deps.envKey,
          files: deps.files,
          readsProject: deps.readsProject,
          command: deps.command,
        },
        setup: ctx.plan.setup,
        env: ctx.setupEnv,
        egressAllow: await this.egressAllow(ctx),
        isolation: ctx.isolation,
        timeoutMs: ctx.timeoutMs,
      },
      ctx.log,
    )
  }
}
