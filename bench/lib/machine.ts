import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import os from 'node:os'

export interface MachineInfo {
  nproc: number
  cpuModel: string
  memTotalBytes: number
  memTotalGiB: number
  kernel: string
  os: string
  node: string
  python3: string
  bash: string
  bwrap: string
  btrfsProgs: string
  cgroup: string
}

function tool(file: string, args: string[]): string {
  try {
    return execFileSync(file, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
      .split('\n')[0]
      ?.trim() as string
  } catch {
    return 'unavailable'
  }
}

function osName(): string {
  try {
    const release = readFileSync('/etc/os-release', 'utf8')
    return /^PRETTY_NAME="?([^"\n]*)"?$/m.exec(release)?.[1] ?? 'unknown'
  } catch {
    return 'unknown'
  }
}

function cgroupLayout(): string {
  const mounts = readFileSync('/proc/mounts', 'utf8')
  const v1 = mounts.split('\n').filter((l) => l.split(' ')[2] === 'cgroup').length
  const v2 = mounts.split('\n').some((l) => l.split(' ')[2] === 'cgroup2')
  if (v1 > 0) return v2 ? `v1 (${v1} hierarchies) + v2 unified` : `v1 (${v1} hierarchies)`
  return v2 ? 'v2' : 'none'
}

let cached: MachineInfo | undefined

/** The machine the figures were measured on, read at run time. */
export function machineInfo(): MachineInfo {
  cached ??= {
    nproc: os.availableParallelism(),
    cpuModel: os.cpus()[0]?.model ?? 'unknown',
    memTotalBytes: os.totalmem(),
    memTotalGiB: Math.round((os.totalmem() / 1024 ** 3) * 10) / 10,
    kernel: os.release(),
    os: osName(),
    node: process.version,
    python3: tool('/usr/bin/python3', ['--version']),
    bash: tool('bash', ['-c', 'echo $BASH_VERSION']),
    bwrap: tool('bwrap', ['--version']),
    btrfsProgs: tool('btrfs', ['--version']),
    cgroup: cgroupLayout(),
  }
  return cached
}

export function describeMachine(m: MachineInfo): string {
  return `${m.nproc} CPU (${m.cpuModel}), ${m.memTotalGiB} GiB, Linux ${m.kernel}, ${m.os}, node ${m.node}, cgroup ${m.cgroup}`
}

/** Which code was measured: the commit and how many files under packages/ differ from it. */
export function codeVersion(): { commit: string; modifiedPackageFiles: number } {
  const commit = tool('git', ['rev-parse', '--short=12', 'HEAD'])
  let modified = 0
  try {
    modified = execFileSync('git', ['status', '--porcelain', '--', 'packages'], { encoding: 'utf8' })
      .split('\n')
      .filter(Boolean).length
  } catch {
    // not a git checkout
  }
  return { commit, modifiedPackageFiles: modified }
}
