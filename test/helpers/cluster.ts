import { execFile } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { mkdir, mkdtemp, readdir, readFile, rm, rmdir, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import { CgroupManager, instanceRunDir, readMounts } from '@cairn/runtime'
import { claimTestRange, NodeNetwork, type TestRange } from './cluster-network.js'
import { ClusterProcess, cgroupV2Root } from './cluster-process.js'
import { nodeDatabaseUrl } from './node-role.js'
import { TestPostgres } from './postgres.js'

const run = promisify(execFile)

const REPO_ROOT = path.resolve(import.meta.dirname, '..', '..')
export const CAIRN_CLI = path.join(REPO_ROOT, 'packages', 'cli', 'bin', 'cairn.js')
/** The port every node's runtime port listens on, at its namespace's address. */
export const NODE_PORT = 7443
const POOL_BYTES = 2 * 1024 * 1024 * 1024

/**
 * One machine of the test cluster: a network namespace with a veth link to the root namespace,
 * a loop-backed btrfs pool of its own, a data dir (hence its own run dir `/run/cairn/<hash>` and
 * sandbox cgroup scope `cairn/<hash>`), and a cgroup its processes run in.
 */
export class ClusterNode {
  process: ClusterProcess | undefined
  private starts = 0
  private readonly credentials = new Map<string, string>()

  constructor(
    readonly cluster: TestCluster,
    readonly name: string,
    readonly network: NodeNetwork,
    readonly dir: string,
  ) {}

  get dataDir(): string {
    return path.join(this.dir, 'data')
  }
  get poolImage(): string {
    return path.join(this.dir, 'pool.img')
  }
  /** The mounted btrfs pool (`--pool-path`). */
  get poolPath(): string {
    return path.join(this.dir, 'pool')
  }
  get runDir(): string {
    return instanceRunDir(this.dataDir)
  }
  get logPath(): string {
    return path.join(this.dir, 'process.log')
  }
  /** `HOST:PORT` the node's runtime port listens on (`--listen`). */
  get listen(): string {
    return `${this.network.address}:${NODE_PORT}`
  }
  /** The PostgreSQL URL as the node reaches it (the root end of its link), as the superuser. */
  databaseUrl(database: string): string {
    return this.cluster.postgres.url(database, this.network.hostSide)
  }
  /** What `cairn node` is given: the node's own login role in `cairn_node` (see node-role.ts). */
  async nodeCredential(database: string): Promise<string> {
    let url = this.credentials.get(database)
    if (url === undefined) {
      url = await nodeDatabaseUrl(this.cluster.postgres, this.cluster.postgres.url(database), {
        role: `cairn_node_${this.name}`,
        host: this.network.hostSide,
      })
      this.credentials.set(database, url)
    }
    return url
  }
  /** The node's runtime ID (`rt_…`), once it has started once. */
  runtimeId(): string | undefined {
    const file = path.join(this.dataDir, 'runtime-id')
    return existsSync(file) ? readFileSync(file, 'utf8').trim() : undefined
  }

  /** The loop device the node's pool is mounted from. */
  async poolDevice(): Promise<string> {
    const { stdout } = await run('losetup', ['--associated', this.poolImage])
    const device = stdout.split(':')[0]
    if (!device) throw new Error(`${this.name}: no loop device for ${this.poolImage}`)
    return device
  }

  /** Starts any `argv` inside the node's namespace, in its cgroup, logging to `process.log`. */
  async spawn(argv: string[], env?: NodeJS.ProcessEnv): Promise<ClusterProcess> {
    if (this.process?.running) throw new Error(`${this.name} already runs pid ${this.process.pid}`)
    this.starts++
    this.process = await ClusterProcess.start(`${this.name}#${this.starts}`, this.network.wrap(argv), {
      cgroupDir: path.join(this.cluster.cgroupDir, this.name),
      logPath: this.logPath,
      env,
    })
    return this.process
  }

  /**
   * `cairn node` on this node (the contract's flags; `extra` adds or overrides runtime flags).
   * Does not wait for it: see `TestCluster.waitForNodes`.
   */
  async start(database: string, extra: string[] = [], env?: NodeJS.ProcessEnv): Promise<ClusterProcess> {
    return await this.spawn(
      [
        process.execPath,
        CAIRN_CLI,
        'node',
        '--database',
        await this.nodeCredential(database),
        '--cluster-dir',
        this.cluster.clusterDir,
        '--listen',
        this.listen,
        '--data-dir',
        this.dataDir,
        '--pool-path',
        this.poolPath,
        '--log-level',
        'info',
        ...extra,
      ],
      { ...process.env, ...env },
    )
  }

  /** `kill -9` of the node process alone (its sandboxes stay, as after a crash of the process). */
  async kill9(): Promise<void> {
    await this.process?.kill9()
  }
  /** SIGSTOP: the process freezes mid-flight, its connections and locks held. */
  pause(): void {
    this.process?.signal('SIGSTOP')
  }
  resume(): void {
    this.process?.signal('SIGCONT')
  }
  /** Drops every packet between the node and PostgreSQL, both ways. */
  partitionFromPostgres(): void {
    this.network.partition(this.network.hostSide, this.cluster.postgres.port)
  }
  healPartition(): void {
    this.network.heal()
  }

  /**
   * Everything the node left goes: its processes (the whole cgroup), its sandboxes (their
   * cgroups), mounts beneath its run dir and its dir, the pool and its loop device.
   */
  async cleanUp(): Promise<void> {
    if (this.process) await this.process.killAll()
    await killSandboxes(this.runDir)
    await unmountBeneath([this.runDir, this.dir])
    await detachLoops(this.poolImage)
    await rm(this.runDir, { recursive: true, force: true })
  }
}

/** Kills and removes every sandbox cgroup in the instance's scope, then the scope. */
async function killSandboxes(runDir: string): Promise<void> {
  const cgroups = new CgroupManager(`cairn/${path.basename(runDir)}`)
  for (const name of await cgroups.list()) {
    await cgroups.kill(name)
    await cgroups.remove(name)
  }
  await cgroups.removeScope()
}

/** Lazily unmounts every mount at or beneath any of `dirs`, deepest first. */
async function unmountBeneath(dirs: string[]): Promise<void> {
  const beneath = (m: string) => dirs.some((d) => m === d || m.startsWith(`${d}/`))
  const mounts = readMounts()
    .map((m) => m.mountPoint)
    .filter(beneath)
    .sort((a, b) => b.length - a.length)
  for (const mountPoint of mounts) await run('umount', ['-l', mountPoint]).catch(() => undefined)
}

async function detachLoops(image: string): Promise<void> {
  const { stdout } = await run('losetup', ['--associated', image]).catch(() => ({ stdout: '' }))
  for (const line of stdout.split('\n')) {
    const device = line.split(':')[0]
    if (device) await run('losetup', ['-d', device]).catch(() => undefined)
  }
}

/**
 * The cluster test bed on one machine: a real PostgreSQL listening on the root end of every
 * node's link; N nodes (`<prefix>-n1` …), each in its own network namespace with its own pool,
 * data dir and cgroup; API replicas on loopback; faults (kill -9, SIGSTOP, a partition from
 * PostgreSQL, PostgreSQL restarted); `close()` removes all of it, whatever state it is in.
 */
export class TestCluster {
  readonly nodes: ClusterNode[] = []
  readonly apis: ClusterProcess[] = []
  postgres!: TestPostgres
  private range: TestRange | undefined
  private closed = false

  private constructor(
    /** `cairnc-<pid>`: the namespaces, cgroups and temp dirs of this run are named after it. */
    readonly prefix: string,
    readonly dir: string,
    readonly cgroupDir: string,
  ) {}

  /** The cluster's certificates (`cairn cluster init --dir`; see `initCertificates`). */
  get clusterDir(): string {
    return path.join(this.dir, 'cluster')
  }

  static async start(options: { nodes: number }): Promise<TestCluster> {
    await sweepDeadRuns()
    const prefix = `cairnc-${process.pid}`
    const dir = await mkdtemp(path.join(os.tmpdir(), `${prefix}-`))
    const cluster = new TestCluster(prefix, dir, path.join(cgroupV2Root(), prefix))
    try {
      await mkdir(cluster.cgroupDir, { recursive: true })
      cluster.range = claimTestRange()
      for (let i = 0; i < options.nodes; i++) {
        const name = `n${i + 1}`
        const network = NodeNetwork.create(prefix, name, cluster.range, i)
        const node = new ClusterNode(cluster, name, network, path.join(dir, name))
        cluster.nodes.push(node)
        await makePool(node)
      }
      cluster.postgres = await TestPostgres.start({
        listenAddresses: cluster.nodes.map((n) => n.network.hostSide),
        trustedNetworks: [cluster.range.cidr],
      })
      // Where a later run finds it if this one is killed before its cleanup.
      await writeFile(path.join(dir, 'postgres-dir'), cluster.postgres.dir)
    } catch (error) {
      await cluster.close()
      throw error
    }
    return cluster
  }

  /** `cairn cluster init --dir <clusterDir>`: the CA and the role certificates. */
  async initCertificates(): Promise<void> {
    await run(process.execPath, [CAIRN_CLI, 'cluster', 'init', '--dir', this.clusterDir])
  }

  /**
   * `cairn server --role api` on loopback, port 0; resolves with its process and URL once it
   * listens. `extra` adds flags (the first replica creates the admin key in its data dir);
   * `dataDir` starts it again in the data dir of an earlier one (the same replica ID).
   */
  async startApi(
    database: string,
    extra: string[] = [],
    env?: NodeJS.ProcessEnv,
    dataDirOf?: string,
  ): Promise<{ process: ClusterProcess; url: string; dataDir: string }> {
    const index = this.apis.length + 1
    const dataDir = dataDirOf ?? path.join(this.dir, `api${index}`)
    await mkdir(dataDir, { recursive: true })
    const api = await ClusterProcess.start(
      `api${index}`,
      [
        process.execPath,
        CAIRN_CLI,
        'server',
        '--role',
        'api',
        '--database',
        this.postgres.url(database),
        '--cluster-dir',
        this.clusterDir,
        '--data-dir',
        dataDir,
        '--port',
        '0',
        '--json',
        // --json logs warnings and errors only; a replay of a model-test failure may ask for more.
        ...(process.env.CAIRN_CLUSTER_LOG_LEVEL ? ['--log-level', process.env.CAIRN_CLUSTER_LOG_LEVEL] : []),
        ...extra,
      ],
      {
        cgroupDir: path.join(this.cgroupDir, `api${index}`),
        logPath: path.join(dataDir, 'process.log'),
        env: { ...process.env, ...env },
      },
    )
    this.apis.push(api)
    const line = await api.waitForLine(/"url"/)
    return { process: api, url: (JSON.parse(line) as { url: string }).url, dataDir }
  }

  /**
   * `cairn server` as one process (role all: API and runtime, its own pool image in its data
   * dir) on loopback: what a cluster is compared with. Stop it with `process.stop()`.
   */
  async startSingleServer(
    database: string,
  ): Promise<{ process: ClusterProcess; url: string; key: string; dataDir: string }> {
    const dataDir = path.join(this.dir, 'single')
    await mkdir(dataDir, { recursive: true })
    const server = await ClusterProcess.start(
      'single',
      [
        process.execPath,
        CAIRN_CLI,
        'server',
        '--database',
        this.postgres.url(database),
        '--data-dir',
        dataDir,
        '--port',
        '0',
        '--json',
      ],
      { cgroupDir: path.join(this.cgroupDir, 'single'), logPath: path.join(this.dir, 'single.log') },
    )
    this.apis.push(server)
    const { url, adminKeyPath } = JSON.parse(await server.waitForLine(/"url"/)) as {
      url: string
      adminKeyPath: string
    }
    return { process: server, url, key: (await readFile(adminKeyPath, 'utf8')).trim(), dataDir }
  }

  /** Stops PostgreSQL (fast: every connection drops), waits `downMs`, starts it again. */
  async restartPostgres(downMs = 0): Promise<void> {
    await this.postgres.stopServer()
    if (downMs > 0) await new Promise((r) => setTimeout(r, downMs))
    await this.postgres.startServer()
  }

  /** Removes everything: processes, sandboxes, mounts, loop devices, namespaces, routes, dirs. */
  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    const step = async (fn: () => Promise<void> | void) => {
      try {
        await fn()
      } catch (error) {
        console.warn(`[cluster] cleanup step failed: ${String(error)}`)
      }
    }
    for (const api of this.apis) await step(() => api.killAll())
    // A single server killed before its own close left its pool mounted.
    await step(async () => {
      await unmountBeneath([path.join(this.dir, 'single'), instanceRunDir(path.join(this.dir, 'single'))])
      await detachLoops(path.join(this.dir, 'single', 'pool.img'))
      await rm(instanceRunDir(path.join(this.dir, 'single')), { recursive: true, force: true })
    })
    for (const node of this.nodes) await step(() => node.cleanUp())
    for (const node of this.nodes) await step(() => node.network.remove())
    await step(() => this.range?.release())
    await step(async () => {
      if (existsSync(this.cgroupDir)) await rmdir(this.cgroupDir)
    })
    if (this.postgres) await step(() => this.postgres.stop())
    await step(() => rm(this.dir, { recursive: true, force: true }))
  }
}

/** A sparse image formatted btrfs and loop-mounted at the node's `poolPath`. */
async function makePool(node: ClusterNode): Promise<void> {
  await mkdir(node.poolPath, { recursive: true })
  await mkdir(node.dataDir, { recursive: true })
  await run('truncate', ['-s', String(POOL_BYTES), node.poolImage])
  await run('mkfs.btrfs', ['-q', '-L', node.network.ns, node.poolImage])
  await run('mount', ['-o', 'loop', node.poolImage, node.poolPath])
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
}

/**
 * What runs of the harness whose process is gone (killed before their cleanup) left: their
 * processes and cgroups, pools and loop devices, namespaces (their veth pairs go with them),
 * temp dirs. Their blackhole routes stay (a new run claims another /24).
 */
async function sweepDeadRuns(): Promise<void> {
  const dead = (name: string) => {
    const pid = /^cairnc-(\d+)(-|$)/.exec(name)?.[1]
    return pid !== undefined && !alive(Number(pid))
  }
  const cgroups = cgroupV2Root()
  for (const name of (await readdir(cgroups)).filter(dead)) {
    for (const child of await readdir(path.join(cgroups, name), { withFileTypes: true })) {
      if (!child.isDirectory()) continue
      await writeFile(path.join(cgroups, name, child.name, 'cgroup.kill'), '1').catch(() => undefined)
      await rmdir(path.join(cgroups, name, child.name)).catch(() => undefined)
    }
    await rmdir(path.join(cgroups, name)).catch(() => undefined)
  }
  for (const name of (await readdir(os.tmpdir())).filter(dead)) {
    const dir = path.join(os.tmpdir(), name)
    const postgres = await readFile(path.join(dir, 'postgres-dir'), 'utf8').catch(() => undefined)
    if (postgres) await TestPostgres.stopLeftover(postgres)
    for (const node of (await readdir(dir)).filter((n) => /^n\d+$/.test(n))) {
      await killSandboxes(instanceRunDir(path.join(dir, node, 'data'))).catch(() => undefined)
      await unmountBeneath([instanceRunDir(path.join(dir, node, 'data')), path.join(dir, node)])
      await detachLoops(path.join(dir, node, 'pool.img'))
    }
    await rm(dir, { recursive: true, force: true })
  }
  const { stdout } = await run('ip', ['netns', 'list']).catch(() => ({ stdout: '' }))
  for (const ns of stdout.split('\n').map((l) => l.split(' ')[0] ?? '')) {
    if (dead(ns)) await run('ip', ['netns', 'del', ns]).catch(() => undefined)
  }
}
