import { spawn } from 'node:child_process'
import { closeSync, existsSync, openSync, readFileSync } from 'node:fs'
import { chmod, chown, mkdir, mkdtemp, rm, rmdir, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import type { Writable } from 'node:stream'
import { BwrapDriver, CgroupManager, DEFAULT_SANDBOX_UID, execTool } from '../packages/runtime/dist/index.js'
import { type Bench, progress, repeat } from './lib/bench.js'
import { machineInfo } from './lib/machine.js'
import type { BenchResult } from './lib/results.js'
import { type Row, row } from './lib/stats.js'

/**
 * The floors every other figure is compared to, measured on this machine in this run: process
 * start-up of the interpreters the examples use, an empty sandbox with the driver's own arguments,
 * and a btrfs snapshot of a 10,000-file subvolume.
 */

export type BaselineName =
  | 'bash -c :'
  | 'python3 -c 0'
  | 'node -e 0'
  | 'bwrap /bin/true'
  | 'bwrap bash -c :'
  | 'bwrap python3 -c 0'
  | 'driver /bin/true (+cgroups)'
  | 'driver /bin/true (spare launcher)'
  | 'btrfs snapshot (10 files)'
  | 'btrfs snapshot (10,000 files)'
  | 'snapshot ioctl (10 files)'
  | 'snapshot ioctl (10,000 files)'

const measured = new Map<BaselineName, Row>()

/** A baseline's median, measured now (with fewer runs) unless this process already measured it. */
export async function floor(name: BaselineName): Promise<{ name: string; median: number }> {
  let r = measured.get(name)
  if (!r) {
    await measure([name], 20)
    r = measured.get(name) as Row
  }
  return { name, median: r.summary.median }
}

/**
 * Runs a command to its exit; `fd3` is handed to it as fd 3 (bwrap's --seccomp program), `fd5`
 * written to a pipe on fd 5 (bwrap's environment, `--args 5`).
 */
function run(file: string, args: readonly string[], fd3?: string, fd5?: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const start = performance.now()
    const extra = fd3 === undefined ? undefined : openSync(fd3, 'r')
    const child = spawn(file, args, {
      stdio: [
        'ignore',
        'ignore',
        'ignore',
        extra ?? 'ignore',
        'ignore',
        fd5 === undefined ? 'ignore' : 'pipe',
      ],
    })
    if (extra !== undefined) closeSync(extra)
    if (fd5 !== undefined) (child.stdio as unknown as Writable[])[5]?.end(fd5)
    child.once('error', reject)
    child.once('exit', (code) => {
      const ms = performance.now() - start
      if (code === 0) resolve(ms)
      else reject(new Error(`${file} ${args.slice(0, 12).join(' ')} … exited with ${code}`))
    })
  })
}

/** A directory tree the sandbox uid can use, and the driver's own arguments for a command. */
async function sandboxFixture(dir: string) {
  await chmod(dir, 0o755)
  const etcDir = path.join(dir, 'etc')
  const kitDir = path.join(dir, 'kit')
  const runDir = path.join(dir, 'run')
  const workspaceDir = path.join(dir, 'workspace')
  for (const d of [etcDir, kitDir, runDir, workspaceDir]) {
    await mkdir(d)
    await chmod(d, 0o755)
  }
  await chown(workspaceDir, DEFAULT_SANDBOX_UID, DEFAULT_SANDBOX_UID)
  const etc: Record<string, string> = {
    passwd: 'root:x:0:0:root:/root:/usr/sbin/nologin\nagent:x:1000:1000::/workspace:/bin/sh\n',
    group: 'root:x:0:\nagent:x:1000:\n',
    hosts: '127.0.0.1\tlocalhost cairn\n',
    hostname: 'cairn\n',
    'resolv.conf': '\n',
  }
  for (const [name, body] of Object.entries(etc))
    await writeFile(path.join(etcDir, name), body, { mode: 0o644 })
  const cgroups = new CgroupManager(CGROUP_SCOPE)
  const driver = new BwrapDriver({
    cgroups,
    hostUid: DEFAULT_SANDBOX_UID,
    hostGid: DEFAULT_SANDBOX_UID,
    etcDir,
    kitDir,
  })
  let n = 0
  const spec = (command: string[]) => ({
    id: `sbx_bench${n++}`,
    workspaceDir,
    runDir,
    command,
    env: {},
    limits: { memoryMiB: 512, pids: 256, cpus: 1 },
  })
  // The same driver keeping one launcher ready in a fresh cgroup, as the server does (it keeps 2).
  const pooled = new BwrapDriver({
    cgroups,
    hostUid: DEFAULT_SANDBOX_UID,
    hostGid: DEFAULT_SANDBOX_UID,
    etcDir,
    kitDir,
    spareLaunchers: 1,
  })
  const startWith = async (which: BwrapDriver, command: string[]) => {
    const t0 = performance.now()
    const sandbox = await which.start(spec(command))
    const exit = await sandbox.exited
    const ms = performance.now() - t0
    await sandbox.destroy()
    if (exit.code !== 0) throw new Error(`sandbox exited with ${exit.code}`)
    return ms
  }
  const start = (command: string[]) => startWith(driver, command)
  // One start through the driver checks the set-up and writes what its arguments refer to (the
  // seccomp program it hands bwrap on fd 3, when it uses one).
  await start(['/bin/true'])
  const seccompFile = path.join(etcDir, 'seccomp.bpf')
  return {
    /** The driver's own bwrap arguments (setpriv, namespaces, read-only root, seccomp), no cgroups. */
    args: (command: string[]) => driver.buildArgs(spec(command)),
    /** What bwrap reads on fd 5 (`--args 5`): the sandbox's environment. */
    fd5: (command: string[]) => driver.envStream(spec(command)),
    /** The file bwrap reads on fd 3 when the arguments say `--seccomp 3`. */
    fd3: (args: readonly string[]) =>
      args.includes('--seccomp') && existsSync(seccompFile) ? seccompFile : undefined,
    /** The whole driver: a fresh cgroup with limits, the launcher that joins it, then bwrap. */
    start,
    /**
     * The driver with a spare launcher: limits written into its cgroup, the command handed over.
     * Waits (untimed) 100 ms first, so the pool has replaced the launcher the last run took.
     */
    startPooled: async (command: string[]) => {
      await new Promise((resolve) => setTimeout(resolve, 100))
      return startWith(pooled, command)
    },
    close: () => pooled.close(),
  }
}

const CGROUP_SCOPE = `cairn/bench-${process.pid}`

/** Removes the (empty) cgroup scope the driver baseline created. */
async function removeCgroupScope(): Promise<void> {
  const mounts = readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
  for (const m of mounts) {
    if (m[2] === 'cgroup' || m[2] === 'cgroup2')
      await rmdir(path.join(m[1] as string, CGROUP_SCOPE)).catch(() => undefined)
  }
}

// BTRFS_IOC_SNAP_CREATE_V2 from one python3 process, each ioctl timed on its own (in ms).
const IOCTL_SNAPSHOTS = `
import fcntl, json, os, struct, sys, time
src, targets = sys.argv[1], sys.argv[2:]
out = []
for dst in targets:
    parent, name = os.path.split(dst)
    t = time.perf_counter()
    s = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    d = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    args = struct.pack("qQQ4Q", s, 0, 0, 0, 0, 0, 0) + name.encode().ljust(4040, b"\\0")
    fcntl.ioctl(d, 0x50009417, bytearray(args))
    os.close(d)
    os.close(s)
    out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
`

function ioctlSnapshots(source: string, targets: string[]): Promise<number[]> {
  return new Promise((resolve, reject) => {
    const child = spawn('/usr/bin/python3', ['-c', IOCTL_SNAPSHOTS, source, ...targets], {
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (c: Buffer) => {
      stdout += c
    })
    child.stderr.on('data', (c: Buffer) => {
      stderr += c
    })
    child.once('error', reject)
    child.once('exit', (code) => {
      if (code === 0) resolve(JSON.parse(stdout) as number[])
      else reject(new Error(`ioctl snapshots failed: ${stderr.trim()}`))
    })
  })
}

/** A loop-backed btrfs in a temp dir, with a read-only subvolume of 10 and of 10,000 files. */
async function withBtrfs<T>(fn: (mnt: string, sources: Record<number, string>) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-btrfs-'))
  const image = path.join(dir, 'pool.img')
  const mnt = path.join(dir, 'mnt')
  let mounted = false
  try {
    await mkdir(mnt)
    await execTool('truncate', ['-s', '512M', image])
    await execTool('mkfs.btrfs', ['-q', image])
    await execTool('mount', ['-o', 'loop,noatime', image, mnt])
    mounted = true
    const sources: Record<number, string> = {}
    for (const count of [10, 10_000]) {
      const staging = path.join(mnt, `staging-${count}`)
      await execTool('btrfs', ['subvolume', 'create', staging])
      for (let i = 0; i < count; i++) {
        const sub = path.join(staging, `d${Math.floor(i / 500)}`)
        if (i % 500 === 0) await mkdir(sub)
        await writeFile(path.join(sub, `f${i}.txt`), `file ${i}\n`)
      }
      sources[count] = path.join(mnt, `rev-${count}`)
      await execTool('btrfs', ['subvolume', 'snapshot', '-r', staging, sources[count] as string])
    }
    await execTool('sync', [])
    return await fn(mnt, sources)
  } finally {
    if (mounted) {
      // Unmounting a loop mount frees its loop device (autoclear).
      await execTool('umount', [mnt]).catch(() => execTool('umount', ['-l', mnt]))
    }
    await rm(dir, { recursive: true, force: true })
  }
}

/** Measures these baselines now, `runs` rounds (each measured again: a density step's floors). */
export async function measure(names: readonly BaselineName[], runs: number): Promise<Row[]> {
  const want = new Set(names)
  const rows: Row[] = []
  const add = (name: BaselineName, samples: number[]) => {
    const r = row(name, samples)
    measured.set(name, r)
    rows.push(r)
  }
  const python = '/usr/bin/python3'
  // Process and sandbox start-ups are sampled round-robin, so a noisy moment is shared by all.
  const probes = new Map<BaselineName, () => Promise<number>>()
  const command = (argv: string[]) => () => run(argv[0] as string, argv.slice(1))
  if (want.has('bash -c :')) probes.set('bash -c :', command(['bash', '-c', ':']))
  if (want.has('python3 -c 0')) probes.set('python3 -c 0', command([python, '-c', '0']))
  if (want.has('node -e 0')) probes.set('node -e 0', command([process.execPath, '-e', '0']))
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-bwrap-'))
  let fixture: Awaited<ReturnType<typeof sandboxFixture>> | undefined
  try {
    const sandbox = await sandboxFixture(dir)
    fixture = sandbox
    const sandboxed: Array<[BaselineName, string[]]> = [
      ['bwrap /bin/true', ['/bin/true']],
      ['bwrap bash -c :', ['bash', '-c', ':']],
      ['bwrap python3 -c 0', [python, '-c', '0']],
    ]
    for (const [name, argv] of sandboxed) {
      if (!want.has(name)) continue
      const [file, ...args] = sandbox.args(argv)
      const fd3 = sandbox.fd3(args)
      const fd5 = sandbox.fd5(argv)
      probes.set(name, () => run(file as string, args, fd3, fd5))
    }
    if (want.has('driver /bin/true (+cgroups)'))
      probes.set('driver /bin/true (+cgroups)', () => sandbox.start(['/bin/true']))
    if (want.has('driver /bin/true (spare launcher)'))
      probes.set('driver /bin/true (spare launcher)', () => sandbox.startPooled(['/bin/true']))
    const samples = new Map<BaselineName, number[]>([...probes.keys()].map((n) => [n, []]))
    for (const probe of probes.values()) await probe() // page cache
    await repeat(runs, 60_000, async () => {
      for (const [name, probe] of probes) samples.get(name)?.push(await probe())
    })
    for (const [name, s] of samples) {
      if (name === 'driver /bin/true (+cgroups)' || name === 'driver /bin/true (spare launcher)') {
        const r = row(name, s, {
          name: 'bwrap /bin/true',
          median: measured.get('bwrap /bin/true')?.summary.median ?? Number.NaN,
        })
        measured.set(name, r)
        rows.push(r)
      } else add(name, s)
    }
  } finally {
    await fixture?.close()
    await rm(dir, { recursive: true, force: true })
    await removeCgroupScope()
  }
  const snapshots = (
    [
      'btrfs snapshot (10 files)',
      'btrfs snapshot (10,000 files)',
      'snapshot ioctl (10 files)',
      'snapshot ioctl (10,000 files)',
    ] as const
  ).filter((n) => want.has(n))
  if (snapshots.length > 0) {
    await withBtrfs(async (mnt, sources) => {
      let made = 0
      for (const name of snapshots) {
        const source = sources[name.includes('10,000') ? 10_000 : 10] as string
        const count = Math.min(runs, 50)
        const targets = Array.from({ length: count + 1 }, () => path.join(mnt, `ws-${made++}`))
        // The same operation a new session makes: a writable snapshot of the read-only revision,
        // with the `btrfs` command (a process per snapshot) or the ioctl alone, timed inside one
        // process. The snapshots are deleted at the end, as the sessions of session-create are, so
        // the kernel's background cleaner does not run during the measurements.
        let samples: number[]
        if (name.startsWith('btrfs')) {
          samples = []
          await run('btrfs', ['subvolume', 'snapshot', source, targets[0] as string])
          let i = 1
          await repeat(count, 30_000, async () => {
            samples.push(await run('btrfs', ['subvolume', 'snapshot', source, targets[i++] as string]))
          })
        } else {
          samples = (await ioctlSnapshots(source, targets)).slice(1)
        }
        for (const target of targets)
          await execTool('btrfs', ['subvolume', 'delete', target]).catch(() => undefined)
        add(name, samples)
      }
    })
  }
  return rows
}

export const baselines: Bench = {
  name: 'baselines',
  description: 'floors: process start-up, an empty bwrap sandbox, a btrfs snapshot of 10,000 files',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const runs = 100
    progress(`process and sandbox start-up (${runs} runs each), btrfs snapshots (50 runs each way)`)
    const rows = await measure(
      [
        'bash -c :',
        'python3 -c 0',
        'node -e 0',
        'bwrap /bin/true',
        'bwrap bash -c :',
        'bwrap python3 -c 0',
        'driver /bin/true (+cgroups)',
        'driver /bin/true (spare launcher)',
        'btrfs snapshot (10 files)',
        'btrfs snapshot (10,000 files)',
        'snapshot ioctl (10 files)',
        'snapshot ioctl (10,000 files)',
      ],
      runs,
    )
    return {
      bench: 'baselines',
      startedAt,
      durationMs: performance.now() - t0,
      machine: machineInfo(),
      config: {
        spawn: 'node child_process.spawn, stdio ignored, time to exit event',
        bwrapArgs:
          'BwrapDriver.buildArgs: setpriv to uid 61000, --unshare-all, read-only /usr root; no cgroup',
        driver:
          'BwrapDriver.start with a real CgroupManager: cgroup created with limits, /bin/sh launcher joins it, then setpriv + bwrap; to exit. Spare launcher: the same with spareLaunchers 1 (a bash launcher already in a fresh cgroup takes the limits and the command; 100 ms untimed before each run for the pool to refill)',
        python: '/usr/bin/python3 (the one sandboxes run)',
        btrfs:
          'loop-backed btrfs in a temp dir; writable snapshot of a read-only subvolume (deleted at the end)',
      },
      rows,
      targets: [],
      notes: [],
    }
  },
}
