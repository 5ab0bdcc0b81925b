import { readFile } from 'node:fs/promises'
import path from 'node:path'
import { CgroupManager } from '@cairn/runtime'
import { type ClusterNode, TestCluster } from './cluster.js'
import { StopWaiting, waitFor } from './cluster-process.js'

/** A row of the `nodes` table, as the tests read it. */
export interface NodeRow {
  id: string
  state: string
  epoch: number
  lease_expires_at: string
  heartbeat_at: string
  lost_at: string | null
}

export interface ApiReplica {
  url: string
  dataDir: string
}

/**
 * Cairn on the cluster test bed: the certificates (`cairn cluster init`), a database, API replicas
 * (`cairn server --role api`) on loopback and `cairn node` in each node's namespace, all ready.
 */
export class CairnCluster {
  private constructor(
    readonly bed: TestCluster,
    readonly database: string,
    readonly apis: ApiReplica[],
    readonly key: string,
    /** Runtime flags every node gets. */
    readonly nodeFlags: string[],
    /** Environment of every process (the cluster's timing: CAIRN_HEARTBEAT_MS, CAIRN_LEASE_MS). */
    readonly env: NodeJS.ProcessEnv,
  ) {}

  /**
   * `startNodes` (default all): how many of the nodes run `cairn node` at first (see `startNode`);
   * `timing`: the nodes' heartbeat and lease, which the API replicas' leader goes by too.
   */
  static async start(options: {
    nodes: number
    apis: number
    nodeFlags?: string[]
    startNodes?: number
    timing?: { heartbeatMs: number; leaseMs: number }
  }): Promise<CairnCluster> {
    const env: NodeJS.ProcessEnv = options.timing
      ? {
          CAIRN_HEARTBEAT_MS: String(options.timing.heartbeatMs),
          CAIRN_LEASE_MS: String(options.timing.leaseMs),
        }
      : {}
    const bed = await TestCluster.start({ nodes: options.nodes })
    try {
      await bed.initCertificates()
      const name = await bed.postgres.createDatabase()
      const database = name.slice(name.lastIndexOf('/') + 1)
      // The first replica makes the schema and the admin key; the others find both in the database.
      const replica = await bed.startApi(database, [], env)
      const info = JSON.parse(await replica.process.waitForLine(/"url"/)) as { adminKeyPath: string }
      const key = (await readFile(info.adminKeyPath, 'utf8')).trim()
      const apis: ApiReplica[] = [{ url: replica.url, dataDir: replica.dataDir }]
      for (let i = 1; i < options.apis; i++) {
        const api = await bed.startApi(database, [], env)
        apis.push({ url: api.url, dataDir: api.dataDir })
      }
      const cluster = new CairnCluster(bed, database, apis, key, options.nodeFlags ?? [], env)
      const first = bed.nodes.slice(0, options.startNodes ?? options.nodes)
      for (const node of first) await cluster.startNode(node)
      await cluster.waitForReady(first.length)
      return cluster
    } catch (error) {
      await bed.close()
      throw error
    }
  }

  get nodes(): ClusterNode[] {
    return this.bed.nodes
  }

  async startNode(node: ClusterNode): Promise<void> {
    await node.start(this.database, ['--name', node.name, ...this.nodeFlags], this.env)
  }

  /** SQL on the cluster's database (psql, as the superuser); rows of `SELECT …` as JSON objects. */
  async query<T>(select: string): Promise<T[]> {
    const out = await this.bed.postgres.sql(
      `SELECT coalesce(json_agg(q), '[]'::json) FROM (${select}) q`,
      this.database,
    )
    return JSON.parse(out) as T[]
  }

  async nodeRows(): Promise<NodeRow[]> {
    return await this.query<NodeRow>(
      'SELECT id, state, epoch, lease_expires_at, heartbeat_at, lost_at FROM nodes ORDER BY id',
    )
  }

  /** Waits until `count` nodes are `ready` with a live lease (each node's process still running). */
  async waitForReady(count: number, timeoutMs = 60_000): Promise<NodeRow[]> {
    return await waitFor(
      `${count} ready nodes`,
      async () => {
        for (const node of this.nodes)
          if (node.process && !node.process.running)
            throw new StopWaiting(`${node.name} exited:\n${node.process.logTail()}`)
        const rows = await this.query<NodeRow>(
          "SELECT id, state, epoch, lease_expires_at, heartbeat_at, lost_at FROM nodes WHERE state = 'ready' AND lease_expires_at::timestamptz > now()",
        )
        return rows.length >= count ? rows : undefined
      },
      timeoutMs,
      200,
    )
  }

  /** The node whose runtime ID is `id`. */
  nodeById(id: string): ClusterNode {
    const node = this.nodes.find((n) => n.runtimeId() === id)
    if (!node) throw new Error(`no node with runtime ID ${id}`)
    return node
  }

  /** Each node's pool device (its loop device): a `WHERE_AGENT` reply names the node it ran on. */
  async poolDevices(): Promise<Map<string, ClusterNode>> {
    const devices = new Map<string, ClusterNode>()
    for (const node of this.nodes) devices.set(await node.poolDevice(), node)
    return devices
  }

  async close(): Promise<void> {
    await this.bed.close()
  }
}

/**
 * An agent whose every reply names the device its workspace is mounted from (`<line> @/dev/loopN`,
 * from /proc/self/mountinfo): each node's pool is a loop device of its own. `sleep N` sleeps first.
 */
export const WHERE_AGENT = {
  'cairn.yaml': 'name: where\ncommand: bash agent.sh\n',
  'agent.sh': [
    'where() { awk \'$5 == "/workspace" { for (i = 7; i <= NF; i++) if ($i == "-") { print $(i + 2); exit } }\' /proc/self/mountinfo; }',
    'while IFS= read -r line; do',
    '  case "$line" in',
    '    sleep\\ *) sleep "${line#sleep }" ;;',
    '  esac',
    '  echo "$line @$(where)"',
    'done',
    '',
  ].join('\n'),
}

/** The device a `WHERE_AGENT` reply names. */
export function replyDevice(text: string): string | undefined {
  return /@(\S+)\s*$/.exec(text)?.[1]
}

/** How many processes of `node`'s sandboxes run `sleep` (agents mid-turn on a `sleep N` prompt). */
export async function sleepingAgents(node: ClusterNode): Promise<number> {
  const scope = new CgroupManager(`cairn/${path.basename(node.runDir)}`)
  let count = 0
  for (const name of await scope.list())
    for (const pid of await scope.pids(name)) {
      const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')
      if (cmdline.startsWith('sleep\0')) count++
    }
  return count
}
