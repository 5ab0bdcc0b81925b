import { CairnProblem } from '@cairn/protocol'
import type { IsolationName } from '../sandbox/driver.js'
import type { StorageDriverName } from '../storage/pool.js'
import * as checks from './host-checks.js'

/**
 * What `cairn doctor` checks and `cairn server` (and `cairn node`) checks again at start: each
 * kernel feature, package and permission Cairn uses, whether it works here, what it costs when it
 * does not, and how to fix it. The same words on the terminal, in `--json` and in the server's log.
 */

export type HostCheckArea = 'permission' | 'kernel' | 'package'

/**
 * `required`: the server refuses to start without it (with the options given); `feature`: it
 * starts without it and says what it cannot do; `info`: it costs nothing today.
 */
export type HostCheckNeed = 'required' | 'feature' | 'info'

export interface HostCheck {
  id: string
  area: HostCheckArea
  /** What is checked, in a few words. */
  what: string
  ok: boolean
  /** What was found: a version, a path, or why it does not work. */
  found: string
  need: HostCheckNeed
  /** What Cairn cannot do without it. */
  costs: string
  /** How to make it work. */
  fix: string
}

export interface HostReport {
  checks: HostCheck[]
  /** The checks a server with these options cannot start without, failed. */
  refused: HostCheck[]
  /** The features it starts without. */
  degraded: HostCheck[]
}

export interface HostCheckOptions {
  /** Where the data dir is (or will be): scratch mounts are tried on its filesystem. */
  dataDir: string
  storage?: StorageDriverName | undefined
  poolPath?: string | undefined
  isolation?: IsolationName | undefined
  /** Where binaries are looked up (`PATH`) and what the probes run with; default this process's. */
  env?: NodeJS.ProcessEnv | undefined
  /** Whether each binary found is asked its version, to show it (`cairn doctor` does). */
  versions?: boolean | undefined
}

type Spec = Omit<HostCheck, 'ok' | 'found'> & { run: () => checks.Finding | Promise<checks.Finding> }

const APT = 'apt-get install'

function specs(options: HostCheckOptions): Spec[] {
  const env = options.env ?? process.env
  const btrfsPool = options.storage !== 'dir'
  const bwrap = (options.isolation ?? 'bwrap') === 'bwrap'
  const imagePool = btrfsPool && options.poolPath === undefined
  const runsc = env.CAIRN_RUNSC
  const version = options.versions ? ['--version'] : undefined
  return [
    {
      id: 'root',
      area: 'permission',
      what: 'root',
      need: 'required',
      run: checks.root,
      costs:
        'everything: the runtime mounts its pool, makes cgroups and namespaces, and runs sandboxes as other uids',
      fix: 'run it as root (sudo cairn server)',
    },
    {
      id: 'user-namespaces',
      area: 'kernel',
      what: 'user namespaces',
      need: 'required',
      run: () => checks.userNamespaces(env),
      costs: 'every sandbox (each runs in user, pid, mount and network namespaces of its own)',
      fix: 'sysctl -w user.max_user_namespaces=15000 (and let the container runtime allow unshare)',
    },
    {
      id: 'seccomp',
      area: 'kernel',
      what: 'seccomp filters',
      need: bwrap ? 'required' : 'feature',
      run: checks.seccomp,
      costs: "bwrap sandboxes (each starts under Cairn's seccomp filter)",
      fix: 'a kernel built with CONFIG_SECCOMP_FILTER (every Debian kernel is)',
    },
    {
      id: 'cgroups',
      area: 'kernel',
      what: 'cgroup controllers',
      need: 'required',
      run: checks.cgroups,
      costs: "sandbox limits (memory, processes, CPU), killing a sandbox's processes, frozen snapshots",
      fix: 'boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1), or mount the memory, pids and cpu controllers',
    },
    {
      id: 'btrfs',
      area: 'kernel',
      what: options.poolPath === undefined ? 'btrfs' : 'btrfs at the pool path',
      need: btrfsPool ? 'required' : 'info',
      run: () => checks.btrfs(options.poolPath),
      costs: '--storage btrfs: O(1) snapshots, restores and forks, and quotas',
      fix:
        options.poolPath === undefined
          ? `modprobe btrfs (${APT} btrfs-progs); or cairn server --storage dir (copies, no quotas)`
          : '--pool-path on a btrfs filesystem, or no --pool-path (a pool image under the data dir), or --storage dir (copies, no quotas)',
    },
    {
      id: 'btrfs-progs',
      area: 'package',
      what: 'btrfs-progs (mkfs.btrfs, btrfs)',
      need: btrfsPool ? 'required' : 'info',
      run: () => checks.tools(['mkfs.btrfs', 'btrfs'], env, version),
      costs: '--storage btrfs: the pool cannot be made or managed',
      fix: `${APT} btrfs-progs; or cairn server --storage dir`,
    },
    {
      id: 'loop-devices',
      area: 'kernel',
      what: 'loop devices',
      need: imagePool ? 'required' : 'info',
      run: () => checks.loopDevices(env),
      costs: 'the pool image under the data dir (a btrfs pool without --pool-path)',
      fix: `modprobe loop (${APT} util-linux for losetup); or --pool-path on a btrfs filesystem`,
    },
    {
      id: 'idmapped-mounts',
      area: 'kernel',
      what: 'idmapped mounts',
      need: bwrap ? 'feature' : 'info',
      run: () => checks.idmappedMounts(options.poolPath ?? options.dataDir),
      costs: 'a host uid per bwrap sandbox (without them every sandbox runs as the one uid 61000)',
      fix: `Linux 5.12 or later (btrfs from 5.15, tmpfs from 6.3) and ${APT} python3`,
    },
    {
      id: 'warm-sessions',
      area: 'kernel',
      what: `room for ${checks.WARM_SESSIONS_GOAL.toLocaleString('en-US')} warm sessions`,
      need: 'info',
      run: checks.warmSessionRoom,
      costs:
        'warm sessions beyond it: a cold start then gets no pid for its processes, or the server no descriptor for its pipes',
      fix: 'sysctl -w kernel.pid_max=4194304; a higher open-files limit for the server (LimitNOFILE=524288 in its unit, or ulimit -Hn as root)',
    },
    {
      id: 'nftables',
      area: 'package',
      what: 'nftables and iproute2',
      need: bwrap ? 'feature' : 'info',
      run: () => checks.nftables(env, options.versions === true),
      costs:
        'transparent egress: only clients that honour HTTP(S)_PROXY reach allowed hosts (not Node fetch, Go)',
      fix: `${APT} nftables iproute2`,
    },
    {
      id: 'bwrap',
      area: 'package',
      what: 'bubblewrap (bwrap)',
      need: bwrap ? 'required' : 'feature',
      run: () => checks.tools(['bwrap'], env, version),
      costs: 'bwrap sandboxes, the default isolation',
      fix: `${APT} bubblewrap`,
    },
    {
      id: 'runsc',
      area: 'package',
      what: 'gVisor (runsc)',
      need: bwrap ? 'feature' : 'required',
      run: () => checks.tools([runsc ?? 'runsc'], env, version),
      costs: 'gVisor sandboxes (isolation: gvisor) and pausing a session with its memory (pause: memory)',
      fix: `${APT} runsc`,
    },
    {
      id: 'criu',
      area: 'package',
      what: 'CRIU (criu)',
      need: 'info',
      run: () => checks.tools(['criu'], env, version),
      costs:
        'nothing today: bwrap sandboxes pause with their memory in RAM only (frozen in place, lost at a release or a restart); gVisor ones also checkpoint to disk, with runsc',
      fix: 'nothing to do (no CRIU checkpoints a bwrap sandbox yet: docs/architecture/pausing.md)',
    },
    {
      id: 'mmdebstrap',
      area: 'package',
      what: 'mmdebstrap',
      need: 'feature',
      run: () => checks.tools(['mmdebstrap'], env, version),
      costs: 'agent images built from Debian (image: debian:<suite>, packages: in cairn.yaml)',
      fix: `${APT} mmdebstrap debian-archive-keyring`,
    },
    {
      id: 'skopeo',
      area: 'package',
      what: 'skopeo and umoci',
      need: 'feature',
      run: () => checks.tools(['skopeo', 'umoci'], env, version),
      costs: 'OCI agent images (image: an OCI reference in cairn.yaml)',
      fix: `${APT} skopeo umoci`,
    },
  ]
}

/** Runs every check (at once: each is a file read or a short process). */
export async function checkHost(options: HostCheckOptions): Promise<HostReport> {
  const results = await Promise.all(
    specs(options).map(async ({ run, ...spec }): Promise<HostCheck> => {
      const finding = await Promise.resolve()
        .then(run)
        .catch((error: unknown) => ({ ok: false, found: (error as Error).message }))
      return { ...spec, ...finding }
    }),
  )
  return {
    checks: results,
    refused: results.filter((c) => !c.ok && c.need === 'required'),
    degraded: results.filter((c) => !c.ok && c.need === 'feature'),
  }
}

/** One line for a check that failed: what, what was found, what it costs, the fix. */
export function describeFailure(check: HostCheck): string {
  return `${check.what}: ${check.found}; costs ${check.costs}; fix: ${check.fix}`
}

/**
 * The error `cairn server` refuses to start with when a required check failed (`unavailable`,
 * each failure in the message and the checks' ids in the details), or undefined.
 */
export function hostRefusal(report: HostReport): CairnProblem | undefined {
  if (report.refused.length === 0) return undefined
  return new CairnProblem(
    'unavailable',
    `this host cannot run Cairn's runtime: ${report.refused.map(describeFailure).join(' | ')} (cairn doctor checks it all)`,
    { checks: report.refused.map((c) => c.id) },
  )
}
