import { cp, mkdir, readFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { CreateBucketCommand } from '@aws-sdk/client-s3'
import type { ClusterNode } from '../helpers/cluster.js'
import { CairnCluster } from '../helpers/cluster-cairn.js'
import { type ClusterProcess, waitFor } from '../helpers/cluster-process.js'
import { startObjectStore, type TestObjectStore } from '../helpers/rgw.js'
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js'
import { ModelClient, Violation } from './client.js'
import type { Bed } from './runner.js'
import { Real, SETTLE_BOUND_MS, STOP_BOUND_MS, type Stats } from './system.js'

/**
 * The cluster's timing on the bed (as test/cluster/replica-faults and node-faults): a node and a
 * replica renew their leases every 250 ms for 2 s, so the leader's verdicts come within seconds,
 * well inside the model's settle bound.
 */
export const CLUSTER_TIMING = { heartbeatMs: 250, leaseMs: 2000 }
const NODES = 2
const REPLICAS = 2
const BUCKET = 'cairn-model'

interface Replica {
  process: ClusterProcess
  dataDir: string
  url: string
}

/**
 * The cluster test bed under the model: two API replicas (`cairn server --role api`) on loopback,
 * two `cairn node`s in network namespaces of their own shipping to a real S3 (Ceph RGW), one
 * PostgreSQL. Requests go to either replica at random; faults kill, stop and restart its parts.
 */
export class ClusterSystem extends Real {
  constructor(
    readonly cluster: CairnCluster,
    readonly store: TestObjectStore,
    readonly replicas: Replica[],
    /** The object store as each node reaches it (a proxy on its link: the store listens on loopback). */
    readonly storeUrls: Map<ClusterNode, string>,
    stats: Stats,
    pick: () => number,
  ) {
    super(
      new ModelClient(
        replicas.map((r) => r.url),
        cluster.key,
        pick,
      ),
      stats,
    )
  }

  get nodes(): ClusterNode[] {
    return this.cluster.nodes
  }

  logTail(lines: number): string {
    const each = Math.max(4, Math.ceil(lines / 2))
    const parts = [
      ...this.replicas.map((r, i) => `-- api${i + 1}:\n${r.process.logTail(each)}`),
      ...this.nodes.map((n) => `-- ${n.name}:\n${n.process?.logTail(each) ?? ''}`),
    ]
    return parts.join('\n')
  }

  /** Where a node runs: S3 shipping to the bed's bucket, the bed's timing. */
  async startNode(node: ClusterNode): Promise<void> {
    const endpoint = this.storeUrls.get(node) ?? this.store.endpoint
    const flags = ['--name', node.name, '--s3-bucket', BUCKET, '--s3-endpoint', endpoint]
    await node.start(this.cluster.database, flags, {
      ...this.cluster.env,
      AWS_ACCESS_KEY_ID: this.store.accessKeyId,
      AWS_SECRET_ACCESS_KEY: this.store.secretAccessKey,
      AWS_REGION: 'default',
    })
  }

  /**
   * Every node runs and is ready with a live lease: one not running is started again and waited
   * for until its new incarnation registered (the killed one's row stays `ready` for its lease).
   */
  async nodesReady(): Promise<void> {
    const restarted: { id: string; epoch: number }[] = []
    for (const node of this.nodes) {
      if (node.process?.running) continue
      const id = node.runtimeId()
      const [row] = id
        ? await this.cluster.query<{ epoch: number }>(`SELECT epoch FROM nodes WHERE id = '${id}'`)
        : []
      await this.startNode(node)
      if (id) restarted.push({ id, epoch: Number(row?.epoch ?? 0) })
    }
    for (const { id, epoch } of restarted)
      await waitFor(
        `node ${id} registered again`,
        async () =>
          (
            await this.cluster.query(
              `SELECT id FROM nodes WHERE id = '${id}' AND epoch > ${epoch} AND state = 'ready'`,
            )
          ).length > 0,
        60_000,
        100,
      )
    await this.cluster.waitForReady(NODES)
  }

  /** PostgreSQL's clock now (what the nodes' lease times are written in). */
  async databaseNow(): Promise<string> {
    const [row] = await this.cluster.query<{ now: string }>('SELECT clock_timestamp() AS now')
    if (!row) throw new Error('PostgreSQL answered no time')
    return row.now
  }

  /**
   * Every node renewed its lease or registered again after `since` (PostgreSQL's clock), within
   * the settle bound. After PostgreSQL was down past a lease a node has fenced itself and answers
   * `503 node_fenced` until it registers again, at its next heartbeat once the database answers
   * (docs/architecture/faults.md); its row still reads `ready` with a live lease meanwhile (the
   * lease was renewed last just before the outage), so `nodesReady` alone let the checks meet the
   * fence (4 of the 30-minute soak's failures, seed 654197258).
   */
  async nodesLiveSince(since: string): Promise<void> {
    const ids = this.nodes.map((node) => node.runtimeId()).filter((id) => id !== undefined)
    try {
      await waitFor(
        'every node renewed or registered again after PostgreSQL came back',
        async () =>
          (
            await this.cluster.query(
              `SELECT id FROM nodes WHERE id IN (${ids.map((id) => `'${id}'`).join(', ')}) AND state = 'ready' AND heartbeat_at::timestamptz > '${since}'::timestamptz`,
            )
          ).length === ids.length,
        SETTLE_BOUND_MS,
        100,
      )
    } catch (error) {
      throw new Violation(`${String(error)}; the nodes:\n${this.logTail(8)}`)
    }
  }

  /** Every node `ready` again: one a failed sequence left cordoned or draining is uncordoned. */
  async uncordonAll(): Promise<void> {
    const held = await this.cluster.query<{ id: string }>(
      "SELECT id FROM nodes WHERE state IN ('cordoned', 'draining')",
    )
    for (const { id } of held) await this.client.call('POST', `/v1/nodes/${id}/uncordon`)
  }

  /** kill -9 of replica `i` (its cgroup goes with it). */
  async killReplica(i: number): Promise<void> {
    const replica = this.replica(i)
    await replica.process.kill9()
    await replica.process.killAll()
  }

  /**
   * SIGTERM to every process of replica `i`'s cgroup (systemd's KillMode=control-group): it must
   * exit 0 within the stop bound.
   */
  async terminateReplica(i: number): Promise<void> {
    const replica = this.replica(i)
    const procs = await readFile(path.join(replica.process.cgroupDir, 'cgroup.procs'), 'utf8')
    for (const pid of procs.split('\n').filter(Boolean)) {
      try {
        process.kill(Number(pid), 'SIGTERM')
      } catch {
        // gone meanwhile
      }
    }
    let timer: NodeJS.Timeout | undefined
    const exit = await Promise.race([
      replica.process.exited,
      new Promise<undefined>((resolve) => {
        timer = setTimeout(() => resolve(undefined), STOP_BOUND_MS)
      }),
    ])
    clearTimeout(timer)
    this.stats.count(this.stats.invariants, 'stops within bound')
    if (exit === undefined || exit.code !== 0) {
      const tail = replica.process.logTail(10)
      await replica.process.killAll()
      throw new Violation(
        `SIGTERM to api${i + 1}'s processes: ${exit ? `exited ${JSON.stringify(exit)}` : `still ran ${STOP_BOUND_MS} ms later`}; its log:\n${tail}`,
      )
    }
    await replica.process.killAll()
  }

  /** Replica `i` started again in its data dir (the same replica ID, a new port). */
  async restartReplica(i: number): Promise<void> {
    const replica = this.replica(i)
    const started = await this.cluster.bed.startApi(
      this.cluster.database,
      [],
      this.cluster.env,
      replica.dataDir,
    )
    this.replicas[i % REPLICAS] = { process: started.process, dataDir: started.dataDir, url: started.url }
    this.client.urls[i % REPLICAS] = started.url
  }

  private replica(i: number): Replica {
    return this.replicas[i % REPLICAS] as Replica
  }
}

/**
 * One cluster for every sequence (it takes ~30 s to start): each sequence begins with every part
 * running and every node ready, and ends by deleting its sessions.
 */
export class ClusterBed implements Bed<ClusterSystem> {
  private constructor(
    readonly cluster: CairnCluster,
    readonly store: TestObjectStore,
    private readonly replicas: Replica[],
    private readonly proxies: Map<ClusterNode, TcpProxy>,
  ) {}

  static async start(): Promise<ClusterBed> {
    const [cluster, store] = await Promise.all([
      CairnCluster.start({ nodes: NODES, apis: REPLICAS, startNodes: 0, timing: CLUSTER_TIMING }),
      startObjectStore(),
    ])
    const proxies = new Map<ClusterNode, TcpProxy>()
    try {
      await store.client().send(new CreateBucketCommand({ Bucket: BUCKET }))
      const replicas = cluster.apis.map((api, i) => ({
        process: cluster.bed.apis[i] as ClusterProcess,
        dataDir: api.dataDir,
        url: api.url,
      }))
      for (const node of cluster.nodes)
        proxies.set(node, await startTcpProxy(store.endpoint, node.network.hostSide))
      const bed = new ClusterBed(cluster, store, replicas, proxies)
      await bed.system(undefined, Math.random).nodesReady()
      return bed
    } catch (error) {
      for (const proxy of proxies.values()) await proxy.close()
      await cluster.close()
      await store.stop()
      throw error
    }
  }

  private system(stats: Stats | undefined, pick: () => number): ClusterSystem {
    const urls = new Map([...this.proxies].map(([node, proxy]) => [node, proxy.url]))
    return new ClusterSystem(this.cluster, this.store, this.replicas, urls, stats as Stats, pick)
  }

  async begin(stats: Stats, pick: () => number): Promise<ClusterSystem> {
    const system = this.system(stats, pick)
    for (const [i, replica] of this.replicas.entries())
      if (!replica.process.running) await system.restartReplica(i)
    await this.store.startGateway().catch(() => undefined)
    await system.uncordonAll()
    await system.nodesReady()
    return system
  }

  async finish(): Promise<void> {}

  async end(
    system: ClusterSystem | undefined,
    failed: boolean,
    seed: number,
    sequence: number,
  ): Promise<void> {
    if (failed) await this.keepLogs(seed, sequence)
    if (system) await deleteAll(system).catch(() => undefined)
  }

  async close(): Promise<void> {
    for (const proxy of this.proxies.values()) await proxy.close()
    await this.cluster.close()
    await this.store.stop()
  }

  /**
   * The logs of every process, to `/tmp/cairn-cluster-model-<seed>-<sequence>/` (each failing
   * sequence's: a soak's later failure no longer overwrites an earlier one's).
   */
  private async keepLogs(seed: number, sequence: number): Promise<void> {
    const dir = path.join(os.tmpdir(), `cairn-cluster-model-${seed}-${sequence}`)
    await mkdir(dir, { recursive: true })
    for (const [i, replica] of this.replicas.entries())
      await cp(replica.process.logPath, path.join(dir, `api${i + 1}.log`)).catch(() => undefined)
    for (const node of this.cluster.nodes)
      await cp(node.logPath, path.join(dir, `${node.name}.log`)).catch(() => undefined)
    process.stdout.write(`[cluster model] its processes' logs: ${dir}\n`)
  }
}

/** Deletes every session of the install (a sequence's leftovers), so the next begins on empty nodes. */
async function deleteAll(system: ClusterSystem): Promise<void> {
  for (let round = 0; round < 5; round++) {
    const list = await system.client.call('GET', '/v1/sessions?limit=100')
    const live = ((list.body?.data ?? []) as { id: string; status: string }[]).filter(
      (s) => s.status !== 'deleted',
    )
    if (live.length === 0) return
    for (const session of live) await system.client.call('DELETE', `/v1/sessions/${session.id}`)
  }
}
