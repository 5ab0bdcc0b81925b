import { chmod, copyFile, mkdir, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem, type NetworkPolicy } from '@cairn/protocol'
import {
  DEFAULT_SANDBOX_UID,
  type EgressSite,
  EnvStore,
  execTool,
  type IsolationName,
  launchEnvironment,
  type NetworkEvent,
  type Runtime,
  runSandboxedCommand,
} from '@cairn/runtime'
import type { ImageService, ResolvedImage } from '../images/image-service.js'
import type { BuildPlan } from './build-plan.js'
import { hostRegistries } from './build-registries.js'

export interface BuildContext {
  revisionId: string
  /** The image the revision's sandboxes (and so its build steps) run on. */
  image: ResolvedImage
  /** Writable staging copy of the revision (the project files). */
  stagingDir: string
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
  /** The operator's egress settings (private exceptions, hosts map), as for sessions. */
  egressSite?: EgressSite | undefined
  /**
   * Hosts every build may reach besides the agent's allowlist (package registries); undefined:
   * the registries npm and pip are configured with on this host, looked up at the first build.
   */
  buildEgressAllow?: readonly string[] | undefined
}

export interface BuildResult {
  envKey: string | undefined
  reusedEnv: boolean
}

const BUILD_LIMITS = { memoryMiB: 2048, pids: 1024, cpus: 2 }

/**
 * Runs a revision's build in sandboxes with network access (this phase only): dependencies into a
 * content-addressed environment subvolume (skipped when one with the same key exists), then the
 * optional setup command in the revision itself.
 */
export class Builder {
  readonly envs: EnvStore
  private readonly sandboxUid: number

  private registries: Promise<readonly string[]> | undefined

  constructor(
    private readonly runtime: Runtime,
    private readonly options: BuilderOptions,
    private readonly images: ImageService,
  ) {
    this.sandboxUid = runtime.options.sandboxUid ?? DEFAULT_SANDBOX_UID
    this.envs = new EnvStore(runtime.pool, this.sandboxUid)
  }

  /** What a build may reach: the agent's allowlist plus the operator's registries. */
  private async egressAllow(ctx: BuildContext): Promise<NetworkPolicy['allow']> {
    this.registries ??= this.options.buildEgressAllow
      ? Promise.resolve(this.options.buildEgressAllow)
      : hostRegistries()
    return [...(ctx.network?.allow ?? []), ...(await this.registries)]
  }

  async build(ctx: BuildContext): Promise<BuildResult> {
    const { pool } = this.runtime
    const deps = ctx.plan.dependencies
    let reusedEnv = false
    // First the image: the dependency environment and the setup command run on it.
    if (ctx.plan.image) await this.images.ensure(ctx.plan.image, { log: ctx.log, timeoutMs: ctx.timeoutMs })
    if (deps) {
      if (await this.envs.has(deps.envKey)) {
        reusedEnv = true
        const inputs = deps.readsProject ? 'project' : deps.files.join(', ')
        ctx.log(`dependencies: reusing environment ${deps.envKey} (${inputs} unchanged)`)
      } else {
        ctx.log(`dependencies: building environment ${deps.envKey}: ${deps.command.join(' ')}`)
        const envStaging = await this.envs.createStaging(deps.envKey, `envbuild_${ctx.revisionId.slice(4)}`)
        try {
          for (const file of deps.files)
            await copyFile(path.join(ctx.stagingDir, file), path.join(envStaging, file))
          await this.chownTree(envStaging)
          // Only an install whose key covers the whole project may read it.
          const project = deps.readsProject ? [{ source: ctx.stagingDir, dest: '/src', readOnly: true }] : []
          if (deps.readsProject) await this.chownTree(ctx.stagingDir)
          await this.run(ctx, envStaging, deps.command, project, undefined)
          await this.envs.seal(envStaging, deps.envKey)
        } catch (error) {
          // The build's error is the one reported; an environment staging tree left behind is logged.
          await pool
            .discardStaging(envStaging)
            .catch((discardError: unknown) =>
              this.runtime.logger.warn(
                { err: discardError, envStaging },
                'discarding an environment staging tree failed',
              ),
            )
          throw error
        }
      }
    }
    if (ctx.plan.setup) {
      ctx.log(`setup: ${ctx.plan.setup.join(' ')}`)
      await this.chownTree(ctx.stagingDir)
      await this.run(ctx, ctx.stagingDir, ctx.plan.setup, [], deps?.envKey)
    }
    return { envKey: deps?.envKey, reusedEnv }
  }

  private async chownTree(dir: string): Promise<void> {
    await execTool('chown', ['-R', '--no-dereference', `${this.sandboxUid}:${this.sandboxUid}`, dir], {
      code: 'storage_error',
    })
  }

  private async run(
    ctx: BuildContext,
    workspaceDir: string,
    command: readonly string[],
    binds: { source: string; dest: string; readOnly: boolean }[],
    envKey: string | undefined,
  ): Promise<void> {
    const runDir = path.join(this.runtime.runDir, 'sandboxes', `build-${ctx.revisionId}`)
    await mkdir(runDir, { recursive: true })
    await chmod(runDir, 0o755)
    await writeFile(path.join(runDir, 'transcript.jsonl'), '', { mode: 0o644 })
    const launch = launchEnvironment(this.envs.dependency(envKey), {
      HOME: '/tmp',
      npm_config_cache: '/tmp/.npm',
      npm_config_update_notifier: 'false',
    })
    // Its own network namespace: out only through the egress proxy, never the host's loopback,
    // its other addresses or its abstract unix sockets. Refusals go to the build log.
    const onEvent = (event: NetworkEvent) => {
      if (!event.allowed) ctx.log(`egress: refused ${event.host}:${event.port} (${event.reason})`)
    }
    const allow = await this.egressAllow(ctx)
    const result = await runSandboxedCommand(this.runtime.driverFor(ctx.isolation), {
      workspaceDir,
      runDir,
      command,
      env: { ...ctx.setupEnv, ...launch.env },
      egress: { ...this.options.egressSite, policy: { allow }, onEvent },
      binds: [...binds, ...launch.binds],
      rootfs: ctx.image.key ? this.images.store.rootfsPath(ctx.image.key) : undefined,
      limits: BUILD_LIMITS,
      logger: this.runtime.logger,
      timeoutMs: ctx.timeoutMs,
      onLine: ctx.log,
    }).finally(() => rm(runDir, { recursive: true, force: true }))
    if (result.timedOut)
      throw new CairnProblem('timeout', `build step '${command.join(' ')}' ran past ${ctx.timeoutMs} ms`)
    if (result.limit)
      throw new CairnProblem(
        'limit_exceeded',
        `build step '${command.join(' ')}' hit its ${result.limit} limit`,
      )
    if (result.code !== 0) {
      throw new CairnProblem(
        'build_failed',
        `build step '${command.join(' ')}' exited with code ${result.code ?? result.signal}`,
      )
    }
  }
}
