import { existsSync, lstatSync, readlinkSync } from 'node:fs'
import { copyFile, cp, mkdir, rm, symlink } from 'node:fs/promises'
import path from 'node:path'
import type { SandboxSpec } from './driver.js'
import { STATX_PRELOAD_PATH, STATX_SHIM_PATH } from './gvisor-statx-fix.js'
import { READ_ONLY_ETC, SANDBOX_USER } from './rootfs.js'
import { sandboxEnvInWorkspace } from './sandbox-env.js'
import { buildOciSeccomp } from './seccomp.js'

/** Top-level host paths that are either merged-/usr symlinks (copied as such) or bound read-only. */
const TOP_LEVEL = ['/bin', '/sbin', '/lib', '/lib64', '/lib32', '/libx32']
export const GENERATED_ETC = ['passwd', 'group', 'hosts', 'hostname', 'resolv.conf']

export interface OciMount {
  destination: string
  type: string
  source: string
  options?: string[]
}

export interface GvisorSpecOptions {
  /** Host directory of the read-only root (see `prepareRootfs`). */
  rootfsDir: string
  kitDir: string
  hostUid: number
  hostGid: number
  /**
   * The statx shim (gvisor-statx-fix.ts) for sandboxes whose root is an image rather than
   * `rootfsDir`: host paths of the compiled library and of the /etc/ld.so.preload naming it, bound
   * read-only into the image at the same paths (undefined: no shim on this host).
   */
  imageStatxShim?: { library: string; preload: string } | undefined
}

/**
 * Builds the read-only root every gVisor sandbox of this instance shares: the merged-/usr symlinks
 * of the host, empty mount points, and the /etc the bwrap driver binds file by file, copied here
 * (the generated passwd, group, hosts … and the host's certificates, linker cache …): each mount
 * costs gVisor a round trip at every start, a file in the root costs nothing.
 */
export async function prepareRootfs(dir: string, generatedEtcDir: string): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o755 })
  for (const top of TOP_LEVEL) {
    if (!existsSync(top)) continue
    const target = path.join(dir, top)
    if (existsSync(target) || isLink(target)) continue
    if (lstatSync(top).isSymbolicLink()) await symlink(readlinkSync(top), target)
    else await mkdir(target, { mode: 0o755 })
  }
  for (const sub of ['usr', 'proc', 'dev', 'tmp', 'etc', 'run/cairn', 'opt/cairn', 'workspace']) {
    await mkdir(path.join(dir, sub), { recursive: true, mode: 0o755 })
  }
  for (const p of READ_ONLY_ETC) {
    if (!existsSync(p)) continue
    const target = path.join(dir, p)
    await rm(target, { recursive: true, force: true })
    // Not the host's private keys: the agent could not read them, and they need no second copy.
    await cp(p, target, {
      recursive: true,
      verbatimSymlinks: true,
      filter: (src) => !src.endsWith('/ssl/private'),
    })
  }
  for (const f of GENERATED_ETC) await copyFile(path.join(generatedEtcDir, f), path.join(dir, 'etc', f))
}

/** Sandbox paths a pool slot's agent finds bound by the host at claim, under the slot's own root. */
export function lateMountDests(spec: Pick<SandboxSpec, 'binds'>): string[] {
  return ['/workspace', '/run/cairn', ...(spec.binds ?? []).map((b) => b.dest)]
}

/**
 * The root of one pool slot: the top level of the shared root (merged-/usr symlinks, mount points)
 * plus an empty directory for each late mount. The host binds the session's directories onto those
 * directories after the sandbox has booted; gVisor walks the root through the host's mount table
 * (with revalidation: `--file-access=shared`), so the agent finds them at the same paths as in a cold
 * sandbox, without a mount inside gVisor.
 */
export async function prepareSlotRoot(dir: string, dests: readonly string[]): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o755 })
  for (const top of TOP_LEVEL) {
    if (!existsSync(top)) continue
    if (lstatSync(top).isSymbolicLink()) await symlink(readlinkSync(top), path.join(dir, top))
    else await mkdir(path.join(dir, top), { mode: 0o755 })
  }
  for (const sub of ['usr', 'proc', 'dev', 'tmp', 'etc', 'opt/cairn', ...dests]) {
    await mkdir(path.join(dir, sub), { recursive: true, mode: 0o755 })
  }
}

function isLink(p: string): boolean {
  try {
    return lstatSync(p).isSymbolicLink()
  } catch {
    return false
  }
}

function bind(source: string, destination: string, readOnly: boolean): OciMount {
  return { destination, type: 'bind', source, options: ['rbind', readOnly ? 'ro' : 'rw'] }
}

/** The mounts of a sandbox, in the order they are made (the bwrap driver's layout). */
export function sandboxMounts(spec: SandboxSpec, options: GvisorSpecOptions): OciMount[] {
  const mounts: OciMount[] = [
    { destination: '/proc', type: 'proc', source: 'proc' },
    { destination: '/dev', type: 'tmpfs', source: 'tmpfs' },
    { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'nodev', 'mode=1777'] },
    { destination: '/tmp', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'nodev', 'mode=1777'] },
  ]
  // An image brings its own /usr; otherwise the host's, read-only.
  if (spec.rootfs && options.imageStatxShim) {
    // Onto the empty mount points the image builder leaves for them (see GvisorDriver.imageSpecOptions).
    mounts.push(bind(options.imageStatxShim.library, STATX_SHIM_PATH, true))
    mounts.push(bind(options.imageStatxShim.preload, STATX_PRELOAD_PATH, true))
  }
  if (!spec.rootfs) {
    mounts.push(bind('/usr', '/usr', true))
    for (const top of TOP_LEVEL) {
      if (existsSync(top) && !lstatSync(top).isSymbolicLink()) mounts.push(bind(top, top, true))
    }
  }
  mounts.push(bind(spec.runDir, '/run/cairn', true))
  mounts.push(bind(options.kitDir, '/opt/cairn', true))
  mounts.push(bind(spec.workspaceDir, '/workspace', false))
  for (const b of spec.binds ?? []) mounts.push(bind(b.source, b.dest, b.readOnly))
  return mounts
}

/**
 * The OCI spec of a pool slot whose root is `slotRoot` (see `prepareSlotRoot`): the fixed mounts of a
 * sandbox, /etc from the shared root, and nothing per session; the init starts in `/` (it changes
 * to /workspace once the workspace is there). The root is writable for gVisor so that writes reach
 * the session's binds under it; the host mounts the slot root itself read-only.
 */
export function buildSlotOciSpec(
  spec: SandboxSpec,
  slotRoot: string,
  options: GvisorSpecOptions,
): Record<string, unknown> {
  const late = new Set(lateMountDests(spec))
  const oci = buildOciSpec(spec, options) as { process: { cwd: string }; mounts: OciMount[] }
  const fixed = oci.mounts.filter((m) => !late.has(m.destination))
  const etc = bind(path.join(options.rootfsDir, 'etc'), '/etc', true)
  return {
    ...oci,
    process: { ...oci.process, cwd: '/' },
    root: { path: slotRoot, readonly: false },
    mounts: [...fixed.slice(0, 5), etc, ...fixed.slice(5)],
  }
}

/**
 * The OCI runtime spec (config.json) of one sandbox: the agent runs as uid 1000 in a user namespace
 * where 1000 is the unprivileged host uid, so what it writes through the gofer belongs to that host
 * uid; no capabilities, no new privileges, its own pid, ipc, uts and network.
 */
export function buildOciSpec(spec: SandboxSpec, options: GvisorSpecOptions): Record<string, unknown> {
  const env = Object.entries(sandboxEnvInWorkspace(spec)).map(([key, value]) => `${key}=${value}`)
  const namespaces = ['pid', 'ipc', 'uts', 'mount', 'user', 'network']
  const seccomp = buildOciSeccomp()
  return {
    ociVersion: '1.0.2',
    process: {
      terminal: false,
      user: { uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid },
      args: [...spec.command],
      env,
      cwd: '/workspace',
      capabilities: { bounding: [], effective: [], inheritable: [], permitted: [], ambient: [] },
      noNewPrivileges: true,
    },
    // An image's root is writable for gVisor, whose own overlay (`--overlay2=root:memory`, see
    // `imageRunscFlags`) keeps the writes in the sandbox's memory; the host's stays read-only.
    root: spec.rootfs ? { path: spec.rootfs, readonly: false } : { path: options.rootfsDir, readonly: true },
    hostname: 'cairn',
    mounts: sandboxMounts(spec, options),
    linux: {
      namespaces: namespaces.map((type) => ({ type })),
      // runsc's gofer runs in this user namespace and needs root mapped to act for the sandbox; the
      // agent cannot become root: no capabilities, no new privileges, so no setuid either.
      uidMappings: [
        { containerID: 0, hostID: 0, size: 1 },
        { containerID: SANDBOX_USER.uid, hostID: options.hostUid, size: 1 },
      ],
      gidMappings: [
        { containerID: 0, hostID: 0, size: 1 },
        { containerID: SANDBOX_USER.gid, hostID: options.hostGid, size: 1 },
      ],
      // bwrap's allow list, enforced by gVisor's kernel (runsc --oci-seccomp).
      ...(seccomp ? { seccomp } : {}),
    },
  }
}
