import { appendFile, mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import type { Readable } from 'node:stream'
import { initClusterTls } from '../packages/runtime/dist/port/index.js'
import { startServer } from '../packages/server/dist/index.js'
import { type RunningNode, startNode } from '../packages/server/dist/node/start-node.js'
import { nodeDatabaseUrl } from '../test/helpers/node-role.js'
import { TestPostgres } from '../test/helpers/postgres.js'
import { type Bench, progress, timedResult } from './lib/bench.js'
import { NodeHttpClient } from './lib/client.js'
import { makeProject, packDir } from './lib/server.js'
import { row } from './lib/stats.js'

const SESSIONS = 50
const MOVES = 20
/** Sessions of the 50 given a turn first (a transcript, a changed workspace). */
const WITH_TURNS = 10
/** Moves of one warm `pause: memory` session under gVisor, back and forth. */
const LIVE_MOVES = 6

async function readAll(stream: Readable): Promise<Buffer> {
  const chunks: Buffer[] = []
  for await (const chunk of stream) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk))
  return Buffer.concat(chunks)
}

/**
 * Moving sessions between nodes: an API replica (`--role api`) in front of two in-process nodes,
 * PostgreSQL, mutual TLS on loopback, no bucket (the direct node-to-node copy). The drain of a
 * node owning 50 idle sessions, from `POST /v1/nodes/{id}/drain` to the node owning none, and one
 * `POST /v1/sessions/{id}/move` at a time. Floor: the copy alone, made on the node's own port
 * (snapshot, digest, export, unpack into a fresh workspace of the same pool, digest: the other
 * node's pool is on the same disk here) without the API, the database, the hold or the network.
 */
export const moves: Bench = {
  name: 'moves',
  description: `drain of a node with ${SESSIONS} idle sessions; one move at a time; the bare copy as floor`,
  run: () =>
    timedResult('moves', async () => {
      const work = await mkdtemp(path.join(tmpdir(), 'cairn-bench-moves-'))
      const postgres = await TestPostgres.start()
      const nodes: RunningNode[] = []
      let server: Awaited<ReturnType<typeof startServer>> | undefined
      try {
        const url = await postgres.createDatabase()
        const clusterDir = path.join(work, 'tls')
        await initClusterTls(clusterDir)
        for (const name of ['node-a', 'node-b'])
          nodes.push(
            await startNode({
              dataDir: path.join(work, name),
              clusterDir,
              database: await nodeDatabaseUrl(postgres, url, {
                role: `cairn_node_${name.replace('-', '_')}`,
              }),
              listen: '127.0.0.1:0',
              name,
              poolImageSizeBytes: 2 * 1024 * 1024 * 1024,
              logLevel: 'error',
            }),
          )
        const [a, b] = nodes as [RunningNode, RunningNode]
        server = await startServer({
          role: 'api',
          dataDir: path.join(work, 'api'),
          database: url,
          clusterDir,
          port: 0,
          writeCredentials: false,
          logLevel: 'error',
        })
        const client = new NodeHttpClient(server.url, server.adminKey ?? '')
        const call = async (method: string, route: string, body?: unknown) => {
          const res = await client.json(method, route, body)
          if (res.status >= 300)
            throw new Error(`${method} ${route}: ${res.status} ${JSON.stringify(res.body)}`)
          return res.body
        }
        await call('POST', '/v1/agents', await packDir(await makeProject('echo', 20)))
        await call('POST', `/v1/nodes/${b.nodeId}/cordon`)
        // Placement reads the nodes' rows at most a second old: the cordon counts after that.
        await new Promise((r) => setTimeout(r, 1100))
        progress(`creating ${SESSIONS} sessions on node A`)
        const ids: string[] = []
        for (let i = 0; i < SESSIONS; i++)
          ids.push((await call('POST', '/v1/sessions', { agent: 'echo' })).id)
        for (const id of ids.slice(0, WITH_TURNS)) {
          const t = await client.stream(`/v1/sessions/${id}/messages`, { prompt: 'hello' })
          if (t.terminal !== 'run.completed') throw new Error(`turn on ${id}: ${t.terminal}`)
        }
        await call('POST', `/v1/nodes/${b.nodeId}/uncordon`)

        // The floor: the copy alone, node port to node port in this process, sequentially.
        progress('floor: bare copies')
        const floor: number[] = []
        for (const [i, id] of ids.slice(0, MOVES).entries()) {
          const t0 = performance.now()
          const snapshotId = `snap_benchfloor${i}`
          await a.port.snapshotWorkspace(id, snapshotId, 'tnt_default')
          const digest = await a.port.digest({ snapshotId })
          const { stream } = await a.port.exportTree({ snapshotId })
          const archive = await readAll(stream)
          const copy = `ses_benchfloor${i}`
          await a.port.createWorkspace(
            copy,
            (await a.port.listStored('revisions'))[0] as string,
            'tnt_default',
          )
          await a.port.replaceWorkspaceWithArchive(copy, 'tnt_default', archive, 1)
          if ((await a.port.digest({ sessionId: copy })) !== digest) throw new Error('floor copy differs')
          floor.push(performance.now() - t0)
          await a.port.deleteWorkspace(copy)
          await a.port.deleteSnapshot(snapshotId)
        }
        const floorMedian = [...floor].sort((x, y) => x - y)[Math.floor(floor.length / 2)] as number

        progress(`draining node A (${SESSIONS} sessions)`)
        const t0 = performance.now()
        await call('POST', `/v1/nodes/${a.nodeId}/drain`)
        for (;;) {
          const list = (await call('GET', '/v1/nodes')) as { data: { id: string; sessions: number }[] }
          if (list.data.find((n) => n.id === a.nodeId)?.sessions === 0) break
          if (performance.now() - t0 > 600_000) throw new Error('drain did not finish in 10 min')
          await new Promise((r) => setTimeout(r, 50))
        }
        const drainMs = performance.now() - t0
        await call('POST', `/v1/nodes/${a.nodeId}/uncordon`)

        progress(`moving ${MOVES} sessions back one at a time`)
        const single: number[] = []
        for (const id of ids.slice(0, MOVES)) {
          const t = performance.now()
          await call('POST', `/v1/sessions/${id}/move`, { toNode: a.nodeId })
          single.push(performance.now() - t)
        }
        progress(`moving a warm pause: memory session ${LIVE_MOVES} times`)
        const live = await liveMoves(call, client)
        const sequentialFloor = floorMedian * SESSIONS
        return {
          config: {
            sessions: SESSIONS,
            sessionsWithATurn: WITH_TURNS,
            project: 'echo agent + 20 small files',
            drainParallelMoves: 4,
            path: 'direct node-to-node copy through the runtime port (no bucket)',
            transport: 'HTTP/2, mutual TLS, 127.0.0.1; PostgreSQL on this machine',
          },
          rows: [
            row('bare copy of one workspace (floor)', floor),
            row(`POST /v1/sessions/{id}/move, one at a time`, single, {
              name: 'bare copy',
              median: floorMedian,
            }),
            row(`drain of a node with ${SESSIONS} idle sessions`, [drainMs], {
              name: `${SESSIONS} bare copies in sequence`,
              median: sequentialFloor,
            }),
            row('live echo (gvisor, pause: memory): cold start, message -> first byte', live.cold),
            row('live: POST …/move of the warm session (its memory carried)', live.move),
            row('live: the next message on the other node (restored) -> first byte', live.restored, {
              name: 'cold start',
              median: live.coldMedian,
            }),
            row('live: the pause a user sees (move + restored first byte)', live.pause, {
              name: 'cold start',
              median: live.coldMedian,
            }),
          ],
          targets: [],
          notes: [
            `drain: ${SESSIONS} sessions in ${(drainMs / 1000).toFixed(1)} s (${(drainMs / SESSIONS).toFixed(0)} ms per session; the leader's pass runs 4 moves at once and starts within a second of the drain)`,
          ],
        }
      } finally {
        await server?.close()
        for (const node of nodes) await node.close().catch(() => undefined)
        await postgres.stop()
        await rm(work, { recursive: true, force: true })
      }
    }),
}

// biome-ignore lint/suspicious/noExplicitAny: the bench reads answers loosely, as `call` above does
type Call = (method: string, route: string, body?: unknown) => Promise<any>

/**
 * A warm `pause: memory` echo session under gVisor moved back and forth between the two nodes:
 * each move's POST, then the next message's first byte (restored there from the carried memory).
 * Beside: the session's first message (a cold start) and those of as many new sessions.
 */
async function liveMoves(call: Call, client: NodeHttpClient) {
  const project = await makeProject('live', 2)
  await appendFile(path.join(project, 'cairn.yaml'), 'isolation: gvisor\npause: memory\n')
  await call('POST', '/v1/agents', await packDir(project))
  await rm(project, { recursive: true, force: true })
  const firstByte = async (id: string, cold: boolean) => {
    const t = await client.stream(`/v1/sessions/${id}/messages`, { prompt: 'hello' })
    if (t.terminal !== 'run.completed' || t.coldStart !== cold || t.firstDeltaMs === undefined)
      throw new Error(`live turn on ${id}: ${t.terminal} cold=${t.coldStart}`)
    return t.firstDeltaMs
  }
  const cold: number[] = []
  for (let i = 0; i < LIVE_MOVES; i++) {
    const { id } = await call('POST', '/v1/sessions', { agent: 'live', keepWarmMs: 600_000 })
    cold.push(await firstByte(id, true))
  }
  const { id } = await call('POST', '/v1/sessions', { agent: 'live', keepWarmMs: 600_000 })
  await firstByte(id, true)
  const move: number[] = []
  const restored: number[] = []
  for (let i = 0; i < LIVE_MOVES; i++) {
    const t = performance.now()
    // No node named: placement picks the other one.
    const moved = await call('POST', `/v1/sessions/${id}/move`, {})
    if (!moved.memoryBytes) throw new Error(`move ${i} carried no memory`)
    move.push(performance.now() - t)
    restored.push(await firstByte(id, false))
  }
  const coldMedian = row('', cold).summary.median
  return { cold, coldMedian, move, restored, pause: move.map((m, i) => m + (restored[i] ?? 0)) }
}
