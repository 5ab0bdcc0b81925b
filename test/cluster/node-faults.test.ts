import { readFile } from 'node:fs/promises'
import path from 'node:path'
import { CgroupManager } from '@cairn/runtime'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { ClusterNode } from '../helpers/cluster.js'
import { CairnCluster, type NodeRow, replyDevice, WHERE_AGENT } from '../helpers/cluster-cairn.js'
import { StopWaiting, waitFor } from '../helpers/cluster-process.js'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { Api, type RunResult } from '../helpers/server.js'

// The faults of issue 18, on three `cairn node` processes in their own namespaces: kill -9, a
// partition from PostgreSQL, SIGSTOP, PostgreSQL restarted. Short leases keep the suite quick.
const HEARTBEAT_MS = 250
const LEASE_MS = 2000
/** How long past a lease the leader may take to notice (its own polling, a transaction). */
const NOTICE_MS = 3000
const SESSIONS_PER_NODE = 4

let cluster: CairnCluster
let api: Api
/** Session IDs by the name of the node they are on. */
const sessionsOn = new Map<string, string[]>()

beforeAll(async () => {
  if (!testsRunOnPostgres()) return
  cluster = await CairnCluster.start({
    nodes: 3,
    apis: 1,
    timing: { heartbeatMs: HEARTBEAT_MS, leaseMs: LEASE_MS },
  })
  api = new Api(cluster.apis[0]?.url as string, cluster.key)
  expect((await api.deploy(await makeProject(WHERE_AGENT))).status).toBe(201)
  // Enough sessions that each node has some; a first turn places each one.
  for (
    let i = 0;
    sessionsOn.size < 3 || [...sessionsOn.values()].some((s) => s.length < SESSIONS_PER_NODE);
    i++
  ) {
    if (i > 60) throw new Error(`placement left a node without sessions: ${JSON.stringify([...sessionsOn])}`)
    const { id } = await api.createSession('where', { keepWarmMs: 600_000 })
    expect((await api.send(id, 'hello')).terminal?.type).toBe('run.completed')
    const node = await nodeOfSession(id)
    sessionsOn.set(node.name, [...(sessionsOn.get(node.name) ?? []), id])
  }
}, 180_000)

afterAll(async () => {
  await cluster?.close()
})

async function nodeOfSession(id: string): Promise<ClusterNode> {
  const [row] = await cluster.query<{ runtime_id: string }>(
    `SELECT runtime_id FROM sessions WHERE id = '${id}'`,
  )
  return cluster.nodeById(row?.runtime_id as string)
}

interface SessionRow {
  id: string
  status: string
  status_cause: string | null
  owner_epoch: number
}
interface TurnRow {
  id: string
  session_id: string
  seq: number
  status: string
  error_code: string | null
  prompt: string
  response: string | null
  ended_at: string | null
}

const sessionRows = (ids: string[]) =>
  cluster.query<SessionRow>(
    `SELECT id, status, status_cause, owner_epoch FROM sessions WHERE id IN (${ids.map((i) => `'${i}'`).join(',')}) ORDER BY id`,
  )
const turnRows = (ids: string[]) =>
  cluster.query<TurnRow>(
    `SELECT id, session_id, seq, status, error_code, prompt, response, ended_at FROM turns WHERE session_id IN (${ids.map((i) => `'${i}'`).join(',')}) ORDER BY session_id, seq`,
  )
const nodeRow = async (node: ClusterNode) =>
  (await cluster.nodeRows()).find((r) => r.id === node.runtimeId()) as NodeRow

/** A message whose stream must end within `withinMs`: its result, or 'hung'. */
async function sendWithin(id: string, prompt: string, withinMs: number): Promise<RunResult | 'hung'> {
  return await Promise.race([
    api.send(id, prompt).catch(
      (error: unknown): RunResult => ({
        status: 0,
        events: [],
        text: '',
        terminal: undefined,
        body: String(error),
      }),
    ),
    new Promise<'hung'>((r) => setTimeout(() => r('hung'), withinMs).unref()),
  ])
}

const failedCode = (result: RunResult | 'hung') =>
  result === 'hung'
    ? 'hung'
    : result.terminal?.type === 'run.failed'
      ? (result.terminal as { error?: { code?: string } }).error?.code
      : `${result.terminal?.type ?? result.status} ${JSON.stringify(result.body ?? '')}`

/** Processes of the node's sandboxes that run `sleep` (an agent mid-turn). */
async function sleepingAgents(node: ClusterNode): Promise<number> {
  const scope = new CgroupManager(`cairn/${path.basename(node.runDir)}`)
  let count = 0
  for (const name of await scope.list())
    for (const pid of await scope.pids(name)) {
      const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')
      if (cmdline.startsWith('sleep\0')) count++
    }
  return count
}

/** Waits until `count` agents of `node` sleep mid-turn; fails at once if a turn already ended. */
async function untilSleeping(node: ClusterNode, count: number, turns: Promise<RunResult | 'hung'>[]) {
  let ended: RunResult | 'hung' | undefined
  for (const turn of turns) void turn.then((result) => (ended ??= result))
  await waitFor(`${count} agents of ${node.name} mid-turn`, async () => {
    if (ended !== undefined) throw new StopWaiting(`a turn ended first: ${failedCode(ended)}`)
    return (await sleepingAgents(node)) >= count
  })
}

/** Restarts `node` (same data dir: same runtime ID) and waits for all three to be ready. */
async function restart(node: ClusterNode): Promise<void> {
  if (node.process?.running) await node.process.stop()
  await cluster.startNode(node)
  await cluster.waitForReady(3)
}

/** Each test starts from three running, ready nodes and no running turn, whatever the one before left. */
async function allNodesUp(): Promise<void> {
  for (const node of cluster.nodes) {
    node.healPartition()
    node.resume()
    if (!node.process?.running) await cluster.startNode(node)
  }
  await cluster.waitForReady(3)
  await waitFor('no running turn', async () => {
    const running = await cluster.query<{ id: string }>("SELECT id FROM turns WHERE status = 'running'")
    return running.length === 0
  })
}

describe.skipIf(!testsRunOnPostgres())('runtime node faults', () => {
  it('kill -9 of a node: its sessions node_lost within the lease, its turns run.failed once; the others go on', async () => {
    await allNodesUp()
    const [victim, ...others] = cluster.nodes as [ClusterNode, ClusterNode, ClusterNode]
    const lost = sessionsOn.get(victim.name) as string[]
    const kept = others.flatMap((n) => sessionsOn.get(n.name) as string[])
    const epochsBefore = new Map((await sessionRows([...lost, ...kept])).map((s) => [s.id, s.owner_epoch]))
    const devices = await cluster.poolDevices()

    const victimTurns = lost.map((id) => sendWithin(id, 'sleep 30', LEASE_MS + NOTICE_MS + 10_000))
    const otherTurns = kept.map((id) => sendWithin(id, 'sleep 3', 30_000))
    await untilSleeping(victim, lost.length, victimTurns)
    const killedAt = Date.now()
    await victim.kill9()

    // Its running turns end run.failed node_lost, none hangs; the session is typed node_lost.
    // `node_lost` as the docs say, even when the API replica sees the node's stream break first.
    for (const result of await Promise.all(victimTurns)) expect(failedCode(result)).toBe('node_lost')
    const row = await waitFor(
      `${victim.name} declared lost`,
      async () => {
        const r = await nodeRow(victim)
        return r.state === 'lost' ? r : undefined
      },
      LEASE_MS + NOTICE_MS,
    )
    expect(Date.parse(row.lost_at as string) - killedAt).toBeLessThan(LEASE_MS + NOTICE_MS)
    for (const s of await sessionRows(lost)) {
      // Typed; not active (its turn ended failed): resumable once the node is back, below.
      expect(s.status_cause).toBe('node_lost')
      expect(s.status).not.toBe('active')
      expect(s.owner_epoch).toBe((epochsBefore.get(s.id) as number) + 1)
    }
    // Each ran once: its first turn and the failed one, nothing more.
    const turns = await turnRows(lost)
    for (const id of lost) {
      const mine = turns.filter((t) => t.session_id === id)
      expect(mine.map((t) => [t.prompt, t.status])).toEqual([
        ['hello', 'completed'],
        ['sleep 30', 'failed'],
      ])
      expect(mine[1]?.error_code).toBe('node_lost')
    }
    const refused = await api.send(lost[0] as string, 'anyone there?')
    expect(refused.status).toBe(503)
    expect(refused.body).toMatchObject({ error: { code: 'node_lost' } })

    // The other nodes' sessions did not notice.
    for (const [i, result] of (await Promise.all(otherTurns)).entries()) {
      expect(result === 'hung' ? 'hung' : result.terminal?.type).toBe('run.completed')
      const device = replyDevice((result as RunResult).text) as string
      expect(devices.get(device)?.name).toBe((await nodeOfSession(kept[i] as string)).name)
    }
    for (const s of await sessionRows(kept)) {
      expect(s.status_cause).not.toBe('node_lost')
      expect(s.owner_epoch).toBe(epochsBefore.get(s.id))
    }

    // The node comes back with the same runtime ID: a new incarnation, its sessions served again.
    await restart(victim)
    expect((await nodeRow(victim)).epoch).toBe(row.epoch + 1)
    const again = await api.send(lost[0] as string, 'back')
    expect(again.terminal?.type).toBe('run.completed')
    expect(devices.get(replyDevice(again.text) as string)?.name).toBe(victim.name)
  }, 120_000)

  it('a node partitioned from PostgreSQL fences itself; what it does after its lease changes nothing', async () => {
    await allNodesUp()
    const node = cluster.nodes[1] as ClusterNode
    const ids = sessionsOn.get(node.name) as string[]
    const before = await nodeRow(node)
    const turn = sendWithin(ids[0] as string, 'sleep 6', LEASE_MS + NOTICE_MS + 15_000)
    await untilSleeping(node, 1, [turn])
    node.partitionFromPostgres()
    try {
      // Cut by its own node's fence (before its lease ends), or by the leader's declaration.
      expect(['node_fenced', 'node_lost']).toContain(failedCode(await turn))
      // Fenced: it stopped its sandboxes itself (the leader cannot reach into a node).
      await waitFor(
        'the node to stop its sandboxes',
        async () => (await sleepingAgents(node)) === 0,
        LEASE_MS + NOTICE_MS,
      )
      // The leader declares it lost once its lease is over.
      const lostRow = await waitFor(
        `${node.name} declared lost`,
        async () => {
          const r = await nodeRow(node)
          return r.state === 'lost' ? r : undefined
        },
        LEASE_MS + NOTICE_MS,
      )
      expect(lostRow.epoch).toBe(before.epoch)
      // Its last heartbeat came before its lease ended.
      expect(Date.parse(lostRow.heartbeat_at)).toBeLessThanOrEqual(Date.parse(lostRow.lease_expires_at))
      const snapshot = await turnRows(ids)
      const sessions = await sessionRows(ids)
      // The sleep would have ended by now: nothing of it reaches the data while cut off …
      await new Promise((r) => setTimeout(r, 6000))
      expect(await turnRows(ids)).toEqual(snapshot)
      node.healPartition()
      // … nor once it can write again: it registers anew, the old incarnation's work is dropped.
      await cluster.waitForReady(3)
      expect((await nodeRow(node)).epoch).toBe(before.epoch + 1)
      await new Promise((r) => setTimeout(r, 2 * HEARTBEAT_MS))
      expect(await turnRows(ids)).toEqual(snapshot)
      expect(await sessionRows(ids)).toEqual(sessions)
      // No registration it gave up on while cut off arrives late as one more incarnation.
      expect((await nodeRow(node)).epoch).toBe(before.epoch + 1)
      const cut = snapshot.find((t) => t.prompt === 'sleep 6')
      expect(cut?.status).toBe('failed')
      expect(cut?.response ?? '').toBe('')
    } finally {
      node.healPartition()
    }
  }, 120_000)

  it('a SIGSTOPped node is declared lost at its lease; woken, it fences itself and its late output changes nothing', async () => {
    await allNodesUp()
    const node = cluster.nodes[2] as ClusterNode
    const ids = sessionsOn.get(node.name) as string[]
    const before = await nodeRow(node)
    const turn = sendWithin(ids[0] as string, 'sleep 2', LEASE_MS + NOTICE_MS + 10_000)
    await untilSleeping(node, 1, [turn])
    node.pause()
    let resumed = false
    try {
      // Its advisory lock stays held (the process lives): the lease is what gives it away.
      expect(failedCode(await turn)).toBe('node_lost')
      const lostRow = await nodeRow(node)
      expect(lostRow).toMatchObject({ state: 'lost', epoch: before.epoch })
      const snapshot = await turnRows(ids)
      const sessions = await sessionRows(ids)
      // The agent finished its sleep meanwhile: its reply waits in the stopped node's pipe.
      await new Promise((r) => setTimeout(r, 2500))
      node.resume()
      resumed = true
      await cluster.waitForReady(3)
      expect((await nodeRow(node)).epoch).toBe(before.epoch + 1)
      await new Promise((r) => setTimeout(r, 1000))
      expect(await turnRows(ids)).toEqual(snapshot)
      expect(await sessionRows(ids)).toEqual(sessions)
      const stopped = snapshot.find((t) => t.prompt === 'sleep 2')
      expect(stopped?.status).toBe('failed')
      expect(stopped?.response ?? '').toBe('')
      // Served again by its new incarnation.
      const again = await api.send(ids[1] as string, 'awake')
      expect(again.terminal?.type).toBe('run.completed')
    } finally {
      if (!resumed) node.resume()
    }
  }, 120_000)

  it('PostgreSQL restarted mid-run: every turn ends, every node is ready again and serves its sessions', async () => {
    await allNodesUp()
    const ids = cluster.nodes.map((n) => (sessionsOn.get(n.name) as string[])[2] as string)
    const turns = ids.map((id) => sendWithin(id, 'sleep 2', 60_000))
    await new Promise((r) => setTimeout(r, 500))
    await cluster.bed.restartPostgres(500)
    for (const result of await Promise.all(turns)) {
      expect(result).not.toBe('hung')
      const { terminal, status, body, events } = result as RunResult
      expect(['run.completed', 'run.failed'], JSON.stringify({ status, body, events })).toContain(
        terminal?.type,
      )
    }
    await cluster.waitForReady(3)
    const devices = await cluster.poolDevices()
    for (const [i, id] of ids.entries()) {
      const again = await api.send(id, `after restart ${i}`)
      expect(again.terminal?.type, JSON.stringify(again.body ?? again.terminal)).toBe('run.completed')
      expect(devices.get(replyDevice(again.text) as string)?.name).toBe(cluster.nodes[i]?.name)
    }
  }, 120_000)
})
