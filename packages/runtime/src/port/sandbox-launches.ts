import { chmod, mkdir, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { AgentLaunch } from '../agent/types.js'
import { type CommandResult, runSandboxedCommand } from '../build/run-command.js'
import type { EgressSite } from '../egress/proxy.js'
import type { ImageStore } from '../images/image-store.js'
import { launchEnvironment } from '../launch/launch-env.js'
import type { MemoryMounts } from '../launch/memory-mounts.js'
import { persistLaunch } from '../launch/persist-mounts.js'
import type { Runtime } from '../runtime.js'
import type { IsolationName } from '../sandbox/driver.js'
import type { EnvStore } from '../storage/env-store.js'
import type { AgentSpec, RuntimeEvents, WorkspaceCommand } from './runtime-port.js'

/** What a sandbox launch is given beside the runtime: the stores its mounts come from and the node's egress. */
export interface SandboxLaunchDeps {
  envs: EnvStore
  images: ImageStore
  memory: MemoryMounts
  egressSite: EgressSite | undefined
  events: RuntimeEvents | undefined
}

/**
 * How a session's sandboxes are launched on this node: an agent's, or a setup command's in a fresh
 * sandbox of its own. Each gets its host paths here: the workspace, the root filesystem of its
 * image, the dependency environment, the agent's memory, the persisted paths, and the node's
 * egress settings over the session's allowlist.
 */
export class SandboxLaunches {
  constructor(
    private readonly runtime: Runtime,
    private readonly deps: SandboxLaunchDeps,
  ) {}

  /** The full launch of a session's agent from its spec (host paths and mounts resolved). */
  async agentLaunch(spec: AgentSpec): Promise<AgentLaunch> {
    const {
      sessionId,
      tenantId: _tenantId,
      dependencyEnvKey,
      imageKey,
      memoryAgentId,
      pause: _pause,
      egress,
      persist,
      ...launch
    } = spec
    const workspaceDir = this.runtime.pool.workspacePath(sessionId)
    const persisted = await this.persistLaunch(workspaceDir, persist, launch.isolation)
    const environment = launchEnvironment(this.deps.envs.dependency(dependencyEnvKey), {
      ...launch.env,
      ...persisted?.env,
    })
    const memory = memoryAgentId ? [this.deps.memory.bind(memoryAgentId)] : []
    return {
      ...launch,
      env: environment.env,
      binds: [...environment.binds, ...memory, ...(persisted?.binds ?? [])],
      home: persisted?.home,
      rootfs: this.rootfs(imageKey),
      sessionId,
      workspaceDir,
      egress: egress && {
        ...this.deps.egressSite,
        ...egress,
        onEvent: (event) => this.deps.events?.network(sessionId, event),
      },
    }
  }

  /** In a fresh sandbox with its own run dir (an empty transcript), removed when it is done. */
  async runCommand(
    command: WorkspaceCommand,
    onLine: (line: string) => void,
    signal: AbortSignal | undefined,
  ): Promise<CommandResult> {
    const { sessionId, isolation, dependencyEnvKey, imageKey, egress, persist, ...spec } = command
    const workspaceDir = this.runtime.pool.workspacePath(sessionId)
    const persisted = await this.persistLaunch(workspaceDir, persist, isolation)
    const environment = launchEnvironment(this.deps.envs.dependency(dependencyEnvKey), {
      ...spec.env,
      ...persisted?.env,
    })
    const runDir = path.join(this.runtime.runDir, 'sandboxes', `setup-${sessionId}`)
    try {
      await mkdir(runDir, { recursive: true })
      await chmod(runDir, 0o755)
      await writeFile(path.join(runDir, 'transcript.jsonl'), '', { mode: 0o644 })
      return await runSandboxedCommand(this.runtime.driverFor(isolation), {
        ...spec,
        onLine,
        signal,
        egress: egress && {
          ...this.deps.egressSite,
          ...egress,
          onEvent: (event) => this.deps.events?.network(sessionId, event),
        },
        env: environment.env,
        binds: [...environment.binds, ...(persisted?.binds ?? [])],
        home: persisted?.home,
        rootfs: this.rootfs(imageKey),
        workspaceDir,
        runDir,
        logger: this.runtime.logger,
      })
    } finally {
      // The command's outcome is decided; a run dir left behind goes with the runtime's at shutdown.
      await rm(runDir, { recursive: true, force: true }).catch((error: unknown) =>
        this.runtime.logger.warn({ err: error, runDir }, 'removing a command run dir failed'),
      )
    }
  }

  /** The mounts of a sandbox's persisted paths (none declared: undefined); not under gVisor yet. */
  private async persistLaunch(
    workspaceDir: string,
    persist: readonly string[] | undefined,
    isolation: IsolationName | undefined,
  ) {
    if (!persist?.length) return undefined
    if (this.runtime.driverFor(isolation).name === 'gvisor')
      throw new CairnProblem(
        'unavailable',
        'persisted paths (cairn.yaml persist:) are not supported under gVisor yet',
      )
    return persistLaunch(workspaceDir, persist, this.runtime.emptyDir, (dir) =>
      this.runtime.pool.chownToSandbox(dir),
    )
  }

  /** The root filesystem of an image's sandboxes; undefined: the host's /usr. */
  private rootfs(imageKey: string | undefined): string | undefined {
    return imageKey ? this.deps.images.rootfsPath(imageKey) : undefined
  }
}
