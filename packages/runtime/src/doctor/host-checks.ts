import { execFile } from 'node:child_process'
import { accessSync, constants, existsSync, readFileSync } from 'node:fs'
import { mkdtemp, rm, statfs } from 'node:fs/promises'
import path from 'node:path'
import { nftAvailable } from '../egress/transparent.js'
import { detectCgroupLayout } from '../sandbox/cgroups.js'
import { IdmapMounter } from '../sandbox/idmap-mounter.js'
import { DEFAULT_SANDBOX_UID_RANGE } from '../sandbox/sandbox-uids.js'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'

/** What one check found: whether it works, and what was seen (a version, a path, or why not). */
export interface Finding {
  ok: boolean
  found: string
}

const BTRFS_SUPER_MAGIC = 0x9123683e
/** Magic numbers of the filesystems a pool path is most often on by mistake, for the message. */
const FS_NAMES: Record<number, string> = {
  [BTRFS_SUPER_MAGIC]: 'btrfs',
  16914836: 'tmpfs',
  61267: 'ext4',
  1481003842: 'xfs',
  2035054128: 'overlayfs',
  801189825: 'zfs',
  26985: 'nfs',
}

function fsName(type: number): string {
  return FS_NAMES[type] ?? `filesystem type 0x${type.toString(16)}`
}

/** The first executable `name` on `searchPath` (a PATH value), or undefined. */
export function findOnPath(name: string, searchPath: string | undefined): string | undefined {
  // A name with a slash is a path of its own (CAIRN_RUNSC=/opt/gvisor/runsc), as for execFile.
  const dirs = name.includes('/') ? [''] : (searchPath ?? '').split(':').filter(Boolean)
  for (const dir of dirs) {
    const candidate = path.resolve(dir, name)
    try {
      accessSync(candidate, constants.X_OK)
      return candidate
    } catch {
      // not here
    }
  }
  return undefined
}

/** Runs a tool briefly; its first output line, or the reason it failed. */
function firstLine(file: string, args: readonly string[], env: NodeJS.ProcessEnv): Promise<Finding> {
  return new Promise((resolve) => {
    execFile(
      file,
      args,
      { timeout: 10_000, encoding: 'utf8', env, ...OWN_PROCESS_GROUP },
      (error, stdout, stderr) => {
        const line = `${stdout}\n${stderr}`.split('\n').find((l) => l.trim() !== '') ?? ''
        if (error) resolve({ ok: false, found: `${file} ${args.join(' ')} failed: ${line || error.message}` })
        else resolve({ ok: true, found: line.trim() })
      },
    )
  })
}

/**
 * Every named tool on the PATH (the first one missing says so), and with `versionArgs` answering
 * them: its version is shown (a server's start skips that: mmdebstrap alone takes 0.5 s).
 */
export async function tools(
  names: readonly string[],
  env: NodeJS.ProcessEnv,
  versionArgs: readonly string[] | undefined,
): Promise<Finding> {
  const found: string[] = []
  for (const name of names) {
    const file = findOnPath(name, env.PATH)
    if (!file) return { ok: false, found: `${name} is not on the PATH` }
    if (!versionArgs) {
      found.push(file)
      continue
    }
    const version = await firstLine(file, versionArgs, env)
    if (!version.ok) return version
    found.push(`${file}${version.found ? ` (${version.found})` : ''}`)
  }
  return { ok: true, found: found.join(', ') }
}

export function root(): Finding {
  const uid = process.getuid?.()
  return uid === 0 ? { ok: true, found: 'running as root' } : { ok: false, found: `running as uid ${uid}` }
}

/** A user namespace made for real (`unshare --user`), after the kernel's own limit. */
export async function userNamespaces(env: NodeJS.ProcessEnv): Promise<Finding> {
  let max = ''
  try {
    max = readFileSync('/proc/sys/user/max_user_namespaces', 'utf8').trim()
  } catch {
    return { ok: false, found: 'the kernel has no user namespaces (no /proc/sys/user/max_user_namespaces)' }
  }
  if (max === '0') return { ok: false, found: 'user.max_user_namespaces is 0' }
  const unshare = findOnPath('unshare', env.PATH)
  if (!unshare) return { ok: true, found: `up to ${max} (not tried: unshare is not on the PATH)` }
  const made = await firstLine(unshare, ['--user', 'true'], env)
  return made.ok ? { ok: true, found: `made one (up to ${max})` } : made
}

/** The seccomp filter mode, which every bwrap sandbox is started with. */
export function seccomp(): Finding {
  if (existsSync('/proc/sys/kernel/seccomp/actions_avail')) {
    const actions = readFileSync('/proc/sys/kernel/seccomp/actions_avail', 'utf8').trim()
    return { ok: true, found: `filters (${actions})` }
  }
  return { ok: false, found: 'the kernel has no seccomp filters (no /proc/sys/kernel/seccomp/actions_avail)' }
}

/** The memory, pids and cpu controllers on cgroup v2, or on v1 (with v2, when mounted, for kill). */
export function cgroups(): Finding {
  let layout: ReturnType<typeof detectCgroupLayout>
  try {
    layout = detectCgroupLayout()
  } catch (error) {
    return { ok: false, found: `could not read the cgroup mounts: ${(error as Error).message}` }
  }
  if (layout.v2Controllers) return { ok: true, found: `cgroup v2 at ${layout.v2} with memory, pids, cpu` }
  const v1 = Object.keys(layout.v1)
  const kill = layout.v2
    ? `, cgroup v2 at ${layout.v2} for kill and freeze`
    : ', no cgroup v2 (kill by signal)'
  if (['memory', 'pids', 'cpu'].every((c) => v1.includes(c)))
    return { ok: true, found: `cgroup v1 (${v1.join(', ')})${kill}` }
  const missing = ['memory', 'pids', 'cpu'].filter((c) => !v1.includes(c))
  return {
    ok: false,
    found: `no ${missing.join(', ')} controller on cgroup v2${layout.v2 ? ` (${layout.v2})` : ''} or v1`,
  }
}

/** btrfs in the kernel (loaded, or a module `mount` can load), or the pool path's own filesystem. */
export async function btrfs(poolPath: string | undefined): Promise<Finding> {
  if (poolPath !== undefined) {
    const dir = nearestExisting(poolPath)
    const type = (await statfs(dir)).type
    return type === BTRFS_SUPER_MAGIC
      ? { ok: true, found: `${poolPath} is on btrfs` }
      : { ok: false, found: `${poolPath} is on ${fsName(type)}, not btrfs` }
  }
  if (
    readFileSync('/proc/filesystems', 'utf8')
      .split('\n')
      .some((l) => l.trim() === 'btrfs')
  )
    return { ok: true, found: 'in the kernel' }
  const release = readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim()
  const module = path.join('/lib/modules', release, 'kernel/fs/btrfs')
  return existsSync(module)
    ? { ok: true, found: `a module of this kernel (${module}), loaded on first mount` }
    : { ok: false, found: `not in this kernel (${release}) and no module for it` }
}

/** Loop devices, for the pool image under the data dir. */
export function loopDevices(env: NodeJS.ProcessEnv): Finding {
  if (!existsSync('/dev/loop-control')) return { ok: false, found: 'no /dev/loop-control' }
  if (!findOnPath('losetup', env.PATH)) return { ok: false, found: 'losetup is not on the PATH' }
  return { ok: true, found: '/dev/loop-control' }
}

/**
 * An idmapped clone of a scratch directory on the data dir's filesystem (the pool's, when given by
 * path), made for real and dropped without being attached: what the bwrap driver does for each
 * sandbox's host uid (which it then mounts in the sandbox's launcher's namespace).
 */
export async function idmappedMounts(near: string): Promise<Finding> {
  const base = nearestExisting(near)
  const type = fsName((await statfs(base)).type)
  let scratch: string
  try {
    scratch = await mkdtemp(path.join(base, '.cairn-doctor-'))
  } catch (error) {
    return { ok: false, found: `could not make a scratch directory in ${base}: ${(error as Error).message}` }
  }
  const mounter = new IdmapMounter()
  const uid = DEFAULT_SANDBOX_UID_RANGE.first
  try {
    await mounter.check(scratch, { diskUid: 0, diskGid: 0, uid, gid: uid })
    return { ok: true, found: `made one on ${type} (${base})` }
  } catch (error) {
    return { ok: false, found: `on ${type} (${base}): ${(error as Error).message}` }
  } finally {
    mounter.close()
    await rm(scratch, { recursive: true, force: true }).catch(() => undefined)
  }
}

/**
 * What each warm bwrap session holds of the machine's bounded resources: processes (bwrap outside,
 * bwrap as the namespace's init, the agent; each takes a pid) and the server's descriptors (one
 * socket, the agent's stdin and stdout; its stderr goes to a file, its run dir's files are open
 * only while a turn writes them).
 */
export const WARM_SESSION_PIDS = 3
export const WARM_SESSION_FDS = 1
/** Issue 33's goal: the room a host should have for warm sessions. */
export const WARM_SESSIONS_GOAL = 10_000

/**
 * How many warm sessions this machine has room for: the pids left below `kernel.pid_max` (threads
 * in use counted) over 3 a sandbox, and the descriptors left below this process's limit (a server
 * started from the same shell gets it; Node raises the soft limit to the hard one) over 1.
 */
export function warmSessionRoom(): Finding {
  const pidMax = Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8'))
  const tasks = Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[3]?.split('/')[1] ?? 0)
  const limits = readFileSync('/proc/self/limits', 'utf8')
  const openFiles = Number(/^Max open files\s+(\d+)/m.exec(limits)?.[1] ?? 0)
  const byPids = Math.floor((pidMax - tasks) / WARM_SESSION_PIDS)
  const byFds = Math.floor((openFiles - 200) / WARM_SESSION_FDS)
  const room = Math.max(0, Math.min(byPids, byFds))
  const n = (x: number) => x.toLocaleString('en-US')
  return {
    ok: room >= WARM_SESSIONS_GOAL,
    found: `about ${n(room)}: kernel.pid_max ${n(pidMax)} with ${n(tasks)} in use, ${WARM_SESSION_PIDS} a sandbox (${n(byPids)}); open files ${n(openFiles)}, ${WARM_SESSION_FDS} a session (${n(byFds)})`,
  }
}

/** nftables where the runtime looks for it, and `ip` for the sandbox's loopback route. */
export async function nftables(env: NodeJS.ProcessEnv, versions: boolean): Promise<Finding> {
  if (!nftAvailable()) return { ok: false, found: 'nft is not in /usr/sbin or /sbin' }
  const ip = await tools(['ip'], env, versions ? ['-V'] : undefined)
  return ip.ok ? { ok: true, found: `nft, ${ip.found}` } : ip
}

function nearestExisting(dir: string): string {
  let at = path.resolve(dir)
  while (!existsSync(at) && path.dirname(at) !== at) at = path.dirname(at)
  return at
}
