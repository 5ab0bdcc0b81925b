import { spawn } from 'node:child_process'
import net from 'node:net'
import type { ClusterNode } from '../test/helpers/cluster.js'
import { CairnCluster } from '../test/helpers/cluster-cairn.js'
import { type Bench, progress, timedResult } from './lib/bench.js'
import { type Client, NodeHttpClient, type StreamTiming } from './lib/client.js'
import { EXAMPLES, packDir } from './lib/server.js'
import { type Row, row, summarize } from './lib/stats.js'
import { healthzSamples, roundTrips } from './lib/turns.js'

const WARM_TURNS = 200
const WARMUP = 20
const COLD_RUNS = 30
const FLOOR_RUNS = 200
const CLIENTS = 12
const THROUGHPUT_WARMUP_MS = 1000
const THROUGHPUT_MS = 5000

/** What one way of serving (the single process, or an API replica and its nodes) is driven through. */
interface Target {
  label: string
  client: NodeHttpClient
}

async function deploy(client: Client, dir: string): Promise<void> {
  const res = await client.json('POST', '/v1/agents', await packDir(dir))
  if (res.status !== 201) throw new Error(`deploy of ${dir}: ${res.status} ${JSON.stringify(res.body)}`)
}

async function createSession(client: Client, extra: Record<string, unknown> = {}): Promise<string> {
  const res = await client.json('POST', '/v1/sessions', { agent: 'echo', ...extra })
  if (res.status !== 201) throw new Error(`create session: ${res.status} ${JSON.stringify(res.body)}`)
  return res.body.id as string
}

async function turn(client: Client, id: string, prompt: string): Promise<StreamTiming> {
  const t = await client.stream(`/v1/sessions/${id}/messages`, { prompt })
  if (t.terminal !== 'run.completed' || t.text !== `${prompt}\n`)
    throw new Error(`turn on ${id}: ${t.status} ${t.terminal} ${JSON.stringify(t.text)} ${t.error ?? ''}`)
  return t
}

/** Warm turns back to back on one session (after a warm-up), and cold starts (create + first reply). */
async function latencies(target: Target): Promise<{ warm: number[]; cold: number[] }> {
  const id = await createSession(target.client, { keepWarmMs: 600_000 })
  for (let i = 0; i < WARMUP; i++) await turn(target.client, id, `warm-up ${i}`)
  const warm: StreamTiming[] = []
  for (let i = 0; i < WARM_TURNS; i++) warm.push(await turn(target.client, id, `ping ${i}`))
  const cold: number[] = []
  for (let i = 0; i < COLD_RUNS; i++) {
    const t0 = performance.now()
    const fresh = await createSession(target.client)
    const created = performance.now() - t0
    const t = await turn(target.client, fresh, 'hello')
    cold.push(created + (t.firstDeltaMs as number))
    await target.client.json('DELETE', `/v1/sessions/${fresh}`)
  }
  await target.client.json('DELETE', `/v1/sessions/${id}`)
  return { warm: roundTrips(warm), cold }
}

/** Closed-loop turns from `CLIENTS` warm sessions for `THROUGHPUT_MS`: turns/s. */
async function turnsPerSecond(client: Client): Promise<{ perSecond: number; latency: number[] }> {
  const ids: string[] = []
  for (let i = 0; i < CLIENTS; i++) {
    const id = await createSession(client, { keepWarmMs: 600_000 })
    await turn(client, id, 'warm')
    ids.push(id)
  }
  const measureFrom = performance.now() + THROUGHPUT_WARMUP_MS
  const deadline = measureFrom + THROUGHPUT_MS
  const latency: number[] = []
  await Promise.all(
    ids.map(async (id, k) => {
      for (let i = 0; performance.now() < deadline; i++) {
        const sent = performance.now()
        const t = await turn(client, id, `s${k} t${i}`)
        if (sent >= measureFrom && performance.now() <= deadline) latency.push(t.completedMs as number)
      }
    }),
  )
  for (const id of ids) await client.json('DELETE', `/v1/sessions/${id}`)
  return { perSecond: (latency.length * 1000) / THROUGHPUT_MS, latency }
}

/** One-byte TCP ping-pong round trips to `host:port` (an echo server), after 20 unmeasured. */
export async function tcpRoundTrips(host: string, port: number, runs: number): Promise<number[]> {
  const socket = net.connect(port, host)
  socket.setNoDelay(true)
  await new Promise((resolve, reject) => socket.once('connect', resolve).once('error', reject))
  const once = () =>
    new Promise<number>((resolve) => {
      const t0 = performance.now()
      socket.once('data', () => resolve(performance.now() - t0))
      socket.write('x')
    })
  for (let i = 0; i < 20; i++) await once()
  const samples: number[] = []
  for (let i = 0; i < runs; i++) samples.push(await once())
  socket.destroy()
  return samples
}

const ECHO_SERVER = (host: string) =>
  `require('net').createServer((s)=>{s.setNoDelay(true);s.pipe(s)}).listen(7999,'${host}',()=>console.log('up'))`

/** A TCP echo server on `host:7999`, in `node`'s namespace when given; stop it with the returned function. */
export async function echoServer(host: string, node?: ClusterNode): Promise<() => void> {
  const argv = [process.execPath, '-e', ECHO_SERVER(host)]
  const [command, ...args] = (node ? node.network.wrap(argv) : argv) as [string, ...string[]]
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'inherit'] })
  await new Promise((resolve) => child.stdout.once('data', resolve))
  return () => child.kill('SIGKILL')
}

/**
 * The cluster of issue 18 against the single process, on one machine: a warm echo turn and a cold
 * start (new session to its first reply) through an API replica to a `cairn node` in a network
 * namespace of its own, beside the same through `cairn server` alone (its own process, as the
 * replica and the nodes are, on the same PostgreSQL);
 * floors: a TCP round trip on loopback and into a node's namespace, and GET /healthz. Then turns/s
 * from 12 closed-loop clients with 1, 2 and 3 nodes behind the replica.
 */
export const cluster: Bench = {
  name: 'cluster',
  description:
    'warm turn and cold start through an API replica to a node vs one process; turns/s on 1-3 nodes',
  run: () =>
    timedResult('cluster', async () => {
      progress('cluster test bed: 3 node namespaces, PostgreSQL, 1 API replica, 1 node started')
      const bed = await CairnCluster.start({ nodes: 3, apis: 1, startNodes: 1 })
      const rows: Row[] = []
      const notes: string[] = []
      try {
        const [n1, n2, n3] = bed.nodes as [ClusterNode, ClusterNode, ClusterNode]
        progress(`floors: TCP round trips x ${FLOOR_RUNS}, loopback and into a node's namespace`)
        const stopLoopback = await echoServer('127.0.0.1')
        const loopback = row('TCP round trip, loopback', await tcpRoundTrips('127.0.0.1', 7999, FLOOR_RUNS))
        stopLoopback()
        const stopVeth = await echoServer(n1.network.address, n1)
        const veth = row(
          'TCP round trip, to a node (veth)',
          await tcpRoundTrips(n1.network.address, 7999, FLOOR_RUNS),
        )
        stopVeth()
        rows.push(loopback, veth)
        const floor = { name: 'TCP loopback', median: loopback.summary.median }

        progress('single process (cairn server, role all, its own process) on the same PostgreSQL')
        const database = await bed.bed.postgres.createDatabase()
        const single = await bed.bed.startSingleServer(database.slice(database.lastIndexOf('/') + 1))
        let alone: { warm: number[]; cold: number[] }
        const client = new NodeHttpClient(single.url, single.key)
        try {
          rows.push(row('GET /healthz, single process', await healthzSamples(client, FLOOR_RUNS), floor))
          await deploy(client, `${EXAMPLES}/echo`)
          alone = await latencies({ label: 'single', client })
        } finally {
          client.close()
          await single.process.stop()
        }
        const api = new NodeHttpClient(bed.apis[0]?.url as string, bed.key, CLIENTS + 4)
        try {
          rows.push(row('GET /healthz, API replica', await healthzSamples(api, FLOOR_RUNS), floor))
          await deploy(api, `${EXAMPLES}/echo`)
          progress(`warm turns x ${WARM_TURNS} and cold starts x ${COLD_RUNS}, both ways`)
          const hop = await latencies({ label: 'cluster', client: api })
          const singleWarm = row('echo warm turn, single process', alone.warm, floor)
          const clusterWarm = row('echo warm turn, API replica -> node', hop.warm, {
            name: 'single process',
            median: singleWarm.summary.median,
          })
          const singleCold = row('echo cold start, single process', alone.cold)
          const clusterCold = row('echo cold start, API replica -> node', hop.cold, {
            name: 'single process',
            median: singleCold.summary.median,
          })
          rows.push(singleWarm, clusterWarm, singleCold, clusterCold)
          const extra = (a: Row, b: Row) => (b.summary.median - a.summary.median).toFixed(2)
          notes.push(
            `the hop to a node adds ${extra(singleWarm, clusterWarm)} ms to a warm turn and ${extra(singleCold, clusterCold)} ms to a cold start (medians); a TCP round trip is ${loopback.summary.median.toFixed(3)} ms on loopback, ${veth.summary.median.toFixed(3)} ms into a node's namespace`,
          )

          for (const [count, node] of [
            [1, undefined],
            [2, n2],
            [3, n3],
          ] as const) {
            if (node) {
              await bed.startNode(node)
              await bed.waitForReady(count)
            }
            progress(`${count} node(s): ${CLIENTS} closed-loop clients for ${THROUGHPUT_MS / 1000} s`)
            const { perSecond, latency } = await turnsPerSecond(api)
            rows.push(
              { ...row(`turns/s, ${count} node(s), ${CLIENTS} clients`, [perSecond]), unit: 'turns/s' },
              row(`turn latency, ${count} node(s), ${CLIENTS} clients`, latency),
            )
            const lat = summarize(latency)
            notes.push(
              `${count} node(s): ${perSecond.toFixed(0)} turns/s, latency p50 ${lat.median.toFixed(2)} ms, p99 ${lat.p99.toFixed(2)} ms`,
            )
          }
        } finally {
          api.close()
        }
        return {
          config: {
            warmTurns: WARM_TURNS,
            warmup: WARMUP,
            coldRuns: COLD_RUNS,
            clients: CLIENTS,
            throughputMs: THROUGHPUT_MS,
            measured:
              'warm: message POST to run.completed, back to back on one session; cold: session create request to the first message.delta of its first turn; turns/s: closed loop, turns sent after a 1 s warm-up and completed within the window',
            layout:
              'PostgreSQL on the host; API replica (cairn server --role api) on loopback; each cairn node in its own network namespace over a veth pair, own loop-backed btrfs pool; all on this one machine',
          },
          rows,
          targets: [],
          notes,
        }
      } finally {
        await bed.close()
      }
    }),
}
