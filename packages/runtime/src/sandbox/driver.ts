import type { Readable, Writable } from 'node:stream'

export interface SandboxLimits {
  memoryMiB: number
  pids: number
  cpus: number
}

export interface SandboxSpec {
  id: string
  /** Host path of the session workspace, mounted read-write at /workspace. */
  workspaceDir: string
  /** Host directory mounted read-only at /run/cairn (transcript and per-sandbox files). */
  runDir: string
  command: readonly string[]
  env: Readonly<Record<string, string>>
  limits: SandboxLimits
  /**
   * `none` (default): loopback only. `egress` (drivers with `transparentEgress`): loopback plus a
   * default route whose TCP connections and DNS queries are redirected to the in-sandbox egress
   * forwarder (`forward.py --transparent`). Every sandbox has a network namespace of its own: there
   * is no way onto the host's network (its loopback, addresses and abstract unix sockets).
   */
  network?: 'none' | 'egress' | undefined
  /** Extra host directories to mount (dependency environments, build sources). */
  binds?: readonly SandboxBind[] | undefined
  /**
   * A writable home of the sandbox's own at this path (a tmpfs, gone with the sandbox), mounted
   * before `binds` (which may keep directories inside it): agents that declare `persist:`.
   */
  home?: string | undefined
  /**
   * The sandbox may be checkpointed (`pause: memory`): it gets the layout a restore recreates (for
   * gVisor, booted on demand rather than claimed from the pool, whose slots have their own root).
   */
  checkpointable?: boolean | undefined
  /**
   * Host path of an image's read-only root filesystem (see images/): the sandbox's root is then an
   * overlay of it with a writable layer of the sandbox's own, gone with the sandbox. Unset: the
   * host's /usr and a few /etc files, read-only.
   */
  rootfs?: string | undefined
  /**
   * Host path of a file the sandbox's stderr is appended to, instead of a pipe the server holds
   * for the sandbox's whole life (drivers that can: `Sandbox.stderrFile` then names it). A warm
   * agent's: the server reads it when a turn ends.
   */
  stderrFile?: string | undefined
}

export interface SandboxBind {
  source: string
  dest: string
  readOnly: boolean
}

export interface SandboxExit {
  code: number | null
  signal: NodeJS.Signals | null
  /** Set when a limit explains the exit. */
  limit: 'memory' | 'pids' | undefined
}

export interface Sandbox {
  readonly id: string
  readonly driver: string
  /** Host pid of the sandbox's outer process. */
  readonly pid: number
  readonly stdin: Writable
  readonly stdout: Readable
  readonly stderr: Readable
  /** The file its stderr goes to (`SandboxSpec.stderrFile`, where the driver honoured it): `stderr` then carries nothing. */
  readonly stderrFile?: string | undefined
  readonly exited: Promise<SandboxExit>
  /** Which limit, if any, the sandbox has hit so far. */
  limitHit(): 'memory' | 'pids' | undefined
  /**
   * `/proc/<pid>/ns/net` of the sandbox's own network namespace, for drivers with the `ports`
   * capability; undefined when the sandbox has none (yet).
   */
  networkNamespace?(): Promise<string | undefined>
  freeze(): Promise<void>
  thaw(): Promise<void>
  /**
   * Bytes of file data the sandbox's processes have dirtied since it started, exact and only ever
   * growing; undefined when it cannot be counted (then anything may have been written). A driver
   * whose writes can happen outside the sandbox's host processes leaves it out.
   */
  writtenBytes?(): number | undefined
  /**
   * Runs a command inside the running sandbox, beside its agent: in its namespaces, cgroups,
   * user and seccomp filter. A driver without it cannot run commands beside the agent (the
   * caller refuses them with a typed error).
   */
  exec?(spec: SandboxExecSpec): Promise<SandboxExecProcess>
  /** Kills every process of the sandbox and releases its resources. */
  destroy(): Promise<void>
}

/** A command to run inside a running sandbox (`Sandbox.exec`). */
export interface SandboxExecSpec {
  command: readonly string[]
  /** Its whole environment (nothing of the host's or the agent's is added). */
  env: Readonly<Record<string, string>>
  /** The directory it runs in, inside the sandbox (default /workspace). */
  cwd?: string | undefined
  /** Run it on a terminal of this size (stdout then carries the terminal, stderr nothing). */
  pty?: { rows: number; cols: number } | undefined
}

/** A command running inside a sandbox: its stdio, its end, and signals to its process group. */
export interface SandboxExecProcess {
  readonly stdin: Writable
  readonly stdout: Readable
  readonly stderr: Readable
  /** Once it exited (and its output drained, within a bound): its code, or the signal that ended it. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
  /** Sends a signal to the command and every process it started (its process group). */
  signal(name: NodeJS.Signals): void
  /** Resizes its terminal (a command started with `pty`; others ignore it). */
  resize(rows: number, cols: number): void
}

/**
 * What a driver can do beyond running a sandbox. A capability set to false is refused with a typed
 * error (`CairnProblem`, see `requireCapability` in capabilities.ts), never faked.
 */
export interface DriverCapabilities {
  /** `freeze`/`thaw` stop every process of the sandbox, so a workspace snapshot is consistent. */
  freeze: boolean
  /** A network of the sandbox's own beyond loopback (egress then goes through the proxy only). */
  network: boolean
  /** Checkpointing a running sandbox's memory to resume it warm later. */
  memorySnapshot: boolean
  /**
   * `pause: memory` as a resident pause: the sandbox frozen in place (its memory in RAM) until
   * the next message thaws it or the node releases it (docs/architecture/pausing.md). The node
   * turns it off with bounds of 0; without `memorySnapshot` a release ends the memory.
   */
  residentPause: boolean
  /** Reaching a TCP port a service listens on inside the sandbox (previews). */
  ports: boolean
  /**
   * Egress without proxy variables: every TCP connection and DNS query of the sandbox is redirected
   * to the egress forwarder (`network: 'egress'`). Without it only proxy-aware clients get out.
   */
  transparentEgress: boolean
}

/** Sandbox technologies Cairn can run an agent under. */
export const ISOLATIONS = ['bwrap', 'gvisor'] as const
export type IsolationName = (typeof ISOLATIONS)[number]

export function isIsolationName(value: unknown): value is IsolationName {
  return typeof value === 'string' && (ISOLATIONS as readonly string[]).includes(value)
}

/** What a sandbox technology must provide; bwrap today, gVisor or a microVM behind the same shape. */
export interface SandboxDriver {
  readonly name: string
  readonly capabilities: DriverCapabilities
  start(spec: SandboxSpec): Promise<Sandbox>
  /**
   * Drivers with `memorySnapshot`: writes a running sandbox's processes and memory to `imageDir`
   * (the sandbox ends with it), and starts a sandbox from such an image instead of its command.
   */
  checkpoint?(sandbox: Sandbox, imageDir: string): Promise<{ bytes: number }>
  restore?(spec: SandboxSpec, imageDir: string): Promise<Sandbox>
  /**
   * Boots ahead the sandbox a later `restore` of `spec` (same id and layout) loads its image into,
   * so that restore does not wait for a boot (gVisor: `runsc create`); `dropRestoreTarget` ends it.
   */
  prepareRestore?(spec: SandboxSpec): Promise<void>
  dropRestoreTarget?(sandboxId: string): Promise<void>
  /** Why a capability this driver lacks cannot be had on this node, where that is known. */
  readonly unavailableBecause?: Partial<Record<keyof DriverCapabilities, string>> | undefined
  /** Kills and removes sandboxes left by an earlier process of this instance. Returns how many. */
  reapOrphans(): Promise<number>
  /** Releases what the driver holds on the host once no sandbox is left (after `reapOrphans`). */
  close(): Promise<void>
  describe(): string
}
