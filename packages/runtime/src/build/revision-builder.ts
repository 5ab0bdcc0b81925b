import { chmod, copyFile, mkdir, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { EgressRule } from '../egress/policy.js'
import type { EgressSite, NetworkEvent } from '../egress/proxy.js'
import type { ImageStore } from '../images/image-store.js'
import { launchEnvironment } from '../launch/launch-env.js'
import type { Runtime } from '../runtime.js'
import type { IsolationName, SandboxBind } from '../sandbox/driver.js'
import type { EnvStore } from '../storage/env-store.js'
import { execTool } from '../util/exec.js'
import { runSandboxedCommand } from './run-command.js'

/** How a revision's dependencies are installed (planned by the server from the project's files). */
export interface DependencyInstall {
  /** Content address of the environment: one with this key is reused, never rebuilt. */
  envKey: string
  /** Files of the project copied into the environment before installing (manifest and lockfile). */
  files: string[]
  /** Whether the install reads the whole project (mounted read-only at /src). */
  readsProject: boolean
  command: string[]
}

/** A revision's build: its staged tree (by revision ID), what to install and run, and how. */
export interface RevisionBuild {
  revisionId: string
  /** Whose build: its dependency environment counts in this tenant's quota. */
  tenantId: string
  /** The image its steps run on (built already); undefined: the host's /usr. */
  imageKey?: string | undefined
  dependencies?: DependencyInstall | undefined
  /** The `setup:` command, run in the revision after dependencies. */
  setup?: string[] | undefined
  /** Environment variables of every step (the agent's `setup` secrets). */
  env: Record<string, string>
  /** What the steps may reach (the agent's allowlist and the registries). */
  egressAllow: readonly EgressRule[]
  isolation?: IsolationName | undefined
  timeoutMs: number
}

export interface RevisionBuildResult {
  /** Whether the dependency environment was there already. */
  reusedEnv: boolean
}

const BUILD_LIMITS = { memoryMiB: 2048, pids: 1024, cpus: 2 }

/**
 * Runs a revision's build in sandboxes with network access (this phase only): dependencies into a
 * content-addressed environment subvolume (skipped when one with the same key exists), then the
 * optional setup command in the staged revision itself. Lines of output go to `log`.
 */
export class RevisionBuilder {
  constructor(
    private readonly runtime: Runtime,
    private readonly envs: EnvStore,
    private readonly images: ImageStore,
    private readonly sandboxUid: number,
    private readonly egressSite: EgressSite | undefined,
  ) {}

  async build(
    build: RevisionBuild,
    stagingDir: string,
    log: (line: string) => void,
  ): Promise<RevisionBuildResult> {
    const deps = build.dependencies
    let reusedEnv = false
    if (deps) {
      if (await this.envs.has(deps.envKey)) {
        reusedEnv = true
        const inputs = deps.readsProject ? 'project' : deps.files.join(', ')
        log(`dependencies: reusing environment ${deps.envKey} (${inputs} unchanged)`)
      } else {
        log(`dependencies: building environment ${deps.envKey}: ${deps.command.join(' ')}`)
        const envStaging = await this.envs.createStaging(
          deps.envKey,
          `envbuild_${build.revisionId.slice(4)}`,
          build.tenantId,
        )
        try {
          for (const file of deps.files)
            await copyFile(path.join(stagingDir, file), path.join(envStaging, file))
          await this.chownTree(envStaging)
          // Only an install whose key covers the whole project may read it.
          const project = deps.readsProject ? [{ source: stagingDir, dest: '/src', readOnly: true }] : []
          if (deps.readsProject) await this.chownTree(stagingDir)
          await this.run(build, envStaging, deps.command, project, undefined, log)
          await this.envs.seal(envStaging, deps.envKey, build.tenantId)
        } catch (error) {
          // The build's error is the one reported; an environment staging tree left behind is logged.
          await this.runtime.pool
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
    if (build.setup) {
      log(`setup: ${build.setup.join(' ')}`)
      await this.chownTree(stagingDir)
      await this.run(build, stagingDir, build.setup, [], deps?.envKey, log)
    }
    return { reusedEnv }
  }

  private async chownTree(dir: string): Promise<void> {
    await execTool('chown', ['-R', '--no-dereference', `${this.sandboxUid}:${this.sandboxUid}`, dir], {
      code: 'storage_error',
    })
  }

  private async run(
    build: RevisionBuild,
    workspaceDir: string,
    command: readonly string[],
    binds: SandboxBind[],
    envKey: string | undefined,
    log: (line: string) => void,
  ): Promise<void> {
    const runDir = path.join(this.runtime.runDir, 'sandboxes', `build-${build.revisionId}`)
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
      if (!event.allowed) log(`egress: refused ${event.host}:${event.port} (${event.reason})`)
    }
    const result = await runSandboxedCommand(this.runtime.driverFor(build.isolation), {
      workspaceDir,
      runDir,
      command,
      env: { ...build.env, ...launch.env },
      egress: { ...this.egressSite, policy: { allow: build.egressAllow }, onEvent },
      binds: [...binds, ...launch.binds],
      rootfs: build.imageKey ? this.images.rootfsPath(build.imageKey) : undefined,
      limits: BUILD_LIMITS,
      logger: this.runtime.logger,
      timeoutMs: build.timeoutMs,
      onLine: log,
    }).finally(() => rm(runDir, { recursive: true, force: true }))
    if (result.timedOut)
      throw new CairnProblem('timeout', `build step '${command.join(' ')}' ran past ${build.timeoutMs} ms`)
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
