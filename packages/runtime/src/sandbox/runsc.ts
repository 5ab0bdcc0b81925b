import { execFile } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { execTool } from '../util/exec.js'

/** How this instance runs gVisor: which binary, its state directory and the platform. */
export interface RunscConfig {
  /** The runsc binary (a name looked up in PATH, or a path). */
  path: string
  /** runsc's `--root`: the state of this instance's containers, and nobody else's. */
  root: string
  /** `ptrace` works on every host; `systrap` on newer runsc; `kvm` needs a working /dev/kvm. */
  platform: string
  /**
   * Flags this runsc release needs for Cairn's layout, learnt from `runsc flags` (see
   * `runscFeatureFlags`): releases since 2023 put an overlay on the root by default.
   */
  featureFlags?: readonly string[] | undefined
}

/**
 * Flags every runsc command that creates or starts a sandbox takes besides `--root` (runsc reads
 * them per command, not per container).
 */
export function runscFlags(config: RunscConfig, options: { sharedRoot?: boolean } = {}): string[] {
  return [
    `--platform=${config.platform}`,
    // gVisor's own network stack with loopback only: never the host's (egress is a unix socket).
    '--network=none',
    // Cairn places the whole sandbox (runsc, gofer, sentry) in its own cgroups before runsc starts.
    '--ignore-cgroups',
    // Lets the agent connect to host unix sockets in its binds: the egress proxy's, in /run/cairn.
    '--host-uds=open',
    // Applies the spec's seccomp section (the bwrap driver's allow list) to the agent's processes.
    '--oci-seccomp',
    // A pool slot's session directories live under its root: gVisor must see what the host (and
    // Cairn, between turns) changes there, as it does for bind mounts.
    ...(options.sharedRoot ? ['--file-access=shared'] : []),
    ...(config.featureFlags ?? []),
  ]
}

/**
 * The flags of a sandbox whose root is an image (`SandboxSpec.rootfs`): gVisor's overlay over the
 * root only, its upper layer in the sandbox's memory (charged to its cgroup: the sentry is in it),
 * so the root is writable and resets with the sandbox while binds (/workspace) write through.
 * Undefined when this release has no `--overlay2` (its older `--overlay` would cover /workspace too).
 */
export function imageRunscFlags(config: RunscConfig): string[] | undefined {
  const flags = runscFlags(config)
  if (!flags.includes('--overlay2=none')) return undefined
  return flags.map((flag) => (flag === '--overlay2=none' ? '--overlay2=root:memory' : flag))
}

/**
 * What `runsc flags` says this release supports: its platforms, and the flags that keep Cairn's
 * layout on newer releases (no overlay over the root, whose writes would stay inside the sandbox).
 */
export async function runscFeatures(
  binary: string,
): Promise<{ platforms: string[]; featureFlags: string[] }> {
  const out = await new Promise<string>((resolve) => {
    execFile(binary, ['flags'], { timeout: 10_000, encoding: 'utf8' }, (error, stdout, stderr) =>
      resolve(error ? '' : `${stdout}${stderr}`),
    )
  })
  return parseRunscFlags(out)
}

/** Reads `runsc flags` output (see `runscFeatures`). */
export function parseRunscFlags(out: string): { platforms: string[]; featureFlags: string[] } {
  // "specifies which platform to use: systrap (default), ptrace, kvm."
  const platformLine = /which platform to use: ([^.]*)\./.exec(out)?.[1] ?? 'ptrace'
  const platforms = platformLine
    .replace(/\(default\)/g, '')
    .split(',')
    .map((p) => p.trim())
    .filter((p) => /^[a-z]+$/.test(p))
  return { platforms, featureFlags: /-overlay2\b/.test(out) ? ['--overlay2=none'] : [] }
}

/** The fastest platform a release offers that works everywhere (systrap since 2023, else ptrace). */
export function defaultPlatform(platforms: readonly string[]): string {
  return platforms.includes('systrap') ? 'systrap' : 'ptrace'
}

/** Runs one runsc management command (kill, delete, pause …) and returns its stdout. */
export async function runsc(
  config: RunscConfig,
  args: readonly string[],
  timeoutMs = 15_000,
): Promise<string> {
  const { stdout } = await execTool(config.path, ['--root', config.root, ...args], {
    code: 'sandbox_failed',
    timeoutMs,
  })
  return stdout
}

export interface RunscContainer {
  id: string
  status: string
  pid: number
}

/** Containers runsc knows under this instance's root (empty when the root does not exist). */
export async function listContainers(config: RunscConfig): Promise<RunscContainer[]> {
  if (!existsSync(config.root)) return []
  const out = await runsc(config, ['list', '-format', 'json'])
  let parsed: unknown
  try {
    parsed = JSON.parse(out)
  } catch {
    return []
  }
  if (!Array.isArray(parsed)) return []
  const containers: RunscContainer[] = []
  for (const entry of parsed) {
    if (typeof entry !== 'object' || entry === null) continue
    const { id, status, pid } = entry as Record<string, unknown>
    if (typeof id !== 'string') continue
    containers.push({
      id,
      status: typeof status === 'string' ? status : 'unknown',
      pid: typeof pid === 'number' ? pid : -1,
    })
  }
  return containers
}

/** Resolves a binary name through PATH (as spawn would), or undefined when it is not installed. */
export function findBinary(name: string): string | undefined {
  if (name.includes('/')) return existsSync(name) ? name : undefined
  const dirs = (process.env.PATH ?? '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin').split(':')
  for (const dir of [...dirs, '/usr/sbin', '/usr/bin', '/sbin', '/bin']) {
    const candidate = path.join(dir, name)
    if (dir && existsSync(candidate)) return candidate
  }
  return undefined
}

/** `runsc --version`'s first line, or undefined when the binary is missing or does not run. */
export function runscVersion(binary: string): Promise<string | undefined> {
  return new Promise((resolve) => {
    execFile(binary, ['--version'], { timeout: 10_000, encoding: 'utf8' }, (error, stdout) => {
      resolve(error ? undefined : stdout.split('\n')[0]?.trim())
    })
  })
}

/**
 * Starts one throwaway sandbox (`runsc do /bin/true`, host root read-only, no network) to learn
 * whether gVisor really runs here: a binary that is installed can still fail on a host whose
 * kernel or platform it does not support.
 */
export async function runscSelfTest(
  config: Pick<RunscConfig, 'path' | 'platform'>,
): Promise<{ ok: true } | { ok: false; reason: string }> {
  const root = await mkdtemp(path.join(tmpdir(), 'cairn-runsc-probe-'))
  try {
    await execTool(
      config.path,
      ['--root', root, `--platform=${config.platform}`, '--network=none', 'do', '/bin/true'],
      { code: 'unavailable', timeoutMs: 30_000 },
    )
    return { ok: true }
  } catch (error) {
    return { ok: false, reason: error instanceof Error ? error.message : String(error) }
  } finally {
    await rm(root, { recursive: true, force: true })
  }
}
