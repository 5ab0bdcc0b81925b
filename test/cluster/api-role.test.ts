import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { Runtime } from '@cairn/runtime'
import { LocalRuntimePort, type RuntimeEvents } from '@cairn/runtime/port'
import { openDatabase, type RunningServer, startServer } from '@cairn/server'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { NODE_LOCK_CLASS } from '../../packages/server/src/cluster/dedicated-connection.js'
import { NodeStore } from '../../packages/server/src/cluster/node-store.js'
import { TestPostgres, testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { Api, type RunResult } from '../helpers/server.js'

// An API replica (`role: 'api'`) with no runtime of its own, on a real PostgreSQL, in front of two
// nodes: real runtimes (own data dir, btrfs pool, sandboxes) behind real LocalRuntimePorts, in
// this process (the remote port is port-remote's; `connectNode` stands where it goes).
const NODES = ['rt_nodea', 'rt_nodeb'] as const
const ECHO = {
  'cairn.yaml': 'name: echo\ncommand: bash agent.sh\n',
  'agent.sh':
    'while IFS= read -r line; do echo "got $line"; pwd > /dev/null; echo "$line" >> seen.txt; done\n',
}
const SLOW = {
  'cairn.yaml': 'name: slow\ncommand: bash agent.sh\n',
  'agent.sh': 'while IFS= read -r line; do echo "working"; sleep 3; echo "done $line"; done\n',
}

let postgres: TestPostgres
let url = ''
let apiDir = ''
let apiDir2 = ''
let server: RunningServer
let server2: RunningServer
let api: Api
let api2: Api
let client: pg.Client
const runtimes = new Map<string, { runtime: Runtime; dataDir: string }>()
const connected: string[] = []
const livenessLocks = new Map<string, pg.Client>()
/** Each node's port (one per node, whichever replica reaches it). */
const ports = new Map<string, LocalRuntimePort>()
/** The port methods the replicas call on the nodes, in order (emptied by a test as it needs). */
const calls: string[] = []
let nodeDb: Awaited<ReturnType<typeof openDatabase>>
let nodeStore: NodeStore
const MiB = 1024 * 1024

/**
 * Registers a node as `cairn node` does: its row (epoch + 1 each time) and its liveness lock held
 * on a connection of its own, which the leader probes; closing that connection is the node's crash.
 */
async function registerNode(id: string): Promise<void> {
  const lock = new pg.Client({ connectionString: url })
  await lock.connect()
  await lock.query('SELECT pg_advisory_lock($1, hashtext($2))', [NODE_LOCK_CLASS, id])
  livenessLocks.set(id, lock)
  await nodeStore.register({
    id,
    name: id,
    address: `https://127.0.0.1/${id}`,
    bootId: 'boot',
    figures: {
      drivers: ['bwrap'],
      cpus: 2,
      warmSandboxes: 0,
      poolFreeBytes: 900 * MiB,
      poolSizeBytes: 1024 * MiB,
    },
    leaseMs: 3600_000,
  })
}

/** The node's process dies: its liveness lock goes with its connection. */
async function crashNode(id: string): Promise<void> {
  await livenessLocks.get(id)?.end()
  livenessLocks.delete(id)
}

async function nodeOf(sessionId: string): Promise<string> {
  const { rows } = await client.query('SELECT runtime_id FROM sessions WHERE id = $1', [sessionId])
  return rows[0].runtime_id as string
}

/** Waits past the routing caches (1 s) so a row changed by hand is seen. */
const pastCaches = () => new Promise((resolve) => setTimeout(resolve, 1200))

beforeAll(async () => {
  postgres = await TestPostgres.start()
  url = await postgres.createDatabase()
  for (const id of NODES) {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), `cairn-cluster-routing-${id}-`))
    const runtime = new Runtime({ dataDir, poolImageSizeBytes: 1024 * 1024 * 1024 })
    await runtime.open()
    runtimes.set(id, { runtime, dataDir })
  }
  apiDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-cluster-routing-api-'))
  // One port per node, whichever replica reaches it (as one node serves every replica); its
  // events go to the first replica's observer (a node's event reaches one replica).
  const connectNode = (row: { id: string }, events: RuntimeEvents) => {
    connected.push(row.id)
    const node = runtimes.get(row.id)
    if (!node) throw new Error(`no node ${row.id}`)
    const port =
      ports.get(row.id) ?? new LocalRuntimePort(node.runtime, { clock: { now: () => Date.now() }, events })
    ports.set(row.id, port)
    // Each call goes to the node's port as it is, its method's name noted first.
    return new Proxy(port, {
      get(target, name) {
        const value: unknown = Reflect.get(target, name)
        if (typeof value !== 'function' || typeof name !== 'string') return value
        return (...args: unknown[]) => {
          calls.push(name)
          return value.apply(target, args)
        }
      },
    })
  }
  const apiOptions = {
    role: 'api',
    database: url,
    port: 0,
    writeCredentials: false,
    logLevel: 'error',
  } as const
  server = await startServer({ ...apiOptions, dataDir: apiDir }, { connectNode })
  api = new Api(server.url, server.adminKey ?? '')
  // A second API replica on the same database (it finds the install and its keys there).
  apiDir2 = await mkdtemp(path.join(os.tmpdir(), 'cairn-cluster-routing-api2-'))
  server2 = await startServer({ ...apiOptions, dataDir: apiDir2 }, { connectNode })
  api2 = new Api(server2.url, server.adminKey ?? '')
  client = new pg.Client({ connectionString: url })
  await client.connect()
  nodeDb = await openDatabase(url)
  nodeStore = new NodeStore(nodeDb)
  for (const id of NODES) await registerNode(id)
}, 180_000)

afterAll(async () => {
  await server2?.close()
  await server?.close()
  for (const lock of livenessLocks.values()) await lock.end().catch(() => undefined)
  await nodeDb?.close()
  await client?.end()
  for (const { runtime, dataDir } of runtimes.values()) {
    await runtime.close().catch(() => undefined)
    await rm(dataDir, { recursive: true, force: true })
  }
  for (const dir of [apiDir, apiDir2]) if (dir) await rm(dir, { recursive: true, force: true })
  await postgres?.stop()
})

// On a PostgreSQL of its own in either pass of the suite: run once (the SQLite pass).
describe.skipIf(testsRunOnPostgres())('cairn server --role api in front of two nodes', () => {
  it('has no runtime of its own and refuses to start without PostgreSQL or a cluster dir', async () => {
    expect(() => server.runtime).toThrow('no runtime of its own')
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-cluster-routing-bad-'))
    try {
      await expect(startServer({ role: 'api', dataDir, port: 0, logLevel: 'error' })).rejects.toMatchObject({
        code: 'validation_failed',
        message: expect.stringContaining('--database'),
      })
      await expect(
        startServer({ role: 'api', dataDir, database: url, port: 0, logLevel: 'error' }),
      ).rejects.toMatchObject({
        code: 'validation_failed',
        message: expect.stringContaining('--cluster-dir'),
      })
    } finally {
      await rm(dataDir, { recursive: true, force: true })
    }
  })

  it('deploys on a placed node, places sessions on both, ships the revision once, and runs each turn on its node', async () => {
    const deploy = await api.deploy(await makeProject(ECHO))
    expect(deploy.status, JSON.stringify(deploy.body)).toBe(201)
    const holders = async () =>
      (await client.query('SELECT runtime_id FROM revision_nodes ORDER BY runtime_id')).rows.map(
        (r) => r.runtime_id as string,
      )
    expect(await holders()).toHaveLength(1)
    const sessions: string[] = []
    for (let i = 0; i < 8; i++) sessions.push((await api.createSession('echo')).id)
    const placed: string[] = []
    for (const id of sessions) placed.push(await nodeOf(id))
    for (const id of NODES) expect(placed.filter((n) => n === id).length).toBeGreaterThanOrEqual(2)
    // Shipped to the other node once, for all of its sessions.
    expect(await holders()).toEqual([...NODES])
    for (const [i, id] of sessions.entries()) {
      const result = await api.send(id, `hello ${i}`)
      expect(result.terminal?.type, JSON.stringify(result.events)).toBe('run.completed')
      expect(result.text).toBe(`got hello ${i}\n`)
      // The workspace is on the session's node and nowhere else.
      const home = placed[i] as string
      for (const [nodeId, { runtime }] of runtimes)
        expect(await runtime.pool.hasWorkspace(id), `${id} on ${nodeId}`).toBe(nodeId === home)
    }
    // The files API, snapshots and a fork reach the session's node.
    const first = sessions[0] as string
    const file = await api.call('GET', `/v1/sessions/${first}/files/content?path=seen.txt`)
    expect(file.status).toBe(200)
    expect(file.body).toBe('hello 0\n')
    const snapshot = await api.call('POST', `/v1/sessions/${first}/snapshots`, { label: 'routed' })
    expect(snapshot.status, JSON.stringify(snapshot.body)).toBe(201)
    const fork = await api.call('POST', `/v1/sessions/${first}/fork`, { snapshotId: snapshot.body.id })
    expect(fork.status, JSON.stringify(fork.body)).toBe(201)
    expect(await nodeOf(fork.body.id)).toBe(placed[0])
    const forked = await api.send(fork.body.id, 'in the fork')
    expect(forked.text).toBe('got in the fork\n')
  }, 240_000)

  it("answers node_lost for a lost node's sessions while the other node's go on", async () => {
    const a = (await api.createSession('echo')).id
    let b = (await api.createSession('echo')).id
    // Until the two are on different nodes.
    while ((await nodeOf(b)) === (await nodeOf(a))) b = (await api.createSession('echo')).id
    const lostNode = await nodeOf(b)
    const { rows: before } = await client.query('SELECT owner_epoch FROM sessions WHERE id = $1', [b])
    await crashNode(lostNode)
    // The leader (in the API replica) sees the free liveness lock and declares the node lost.
    for (let i = 0; i < 100; i++) {
      const { rows } = await client.query('SELECT state FROM nodes WHERE id = $1', [lostNode])
      if (rows[0]?.state === 'lost') break
      await new Promise((r) => setTimeout(r, 100))
    }
    const { rows: after } = await client.query('SELECT owner_epoch FROM sessions WHERE id = $1', [b])
    expect(Number(after[0].owner_epoch)).toBe(Number(before[0].owner_epoch) + 1)
    await pastCaches()
    try {
      const refused = await api.send(b, 'anyone there?')
      expect(refused.status).toBe(503)
      expect(refused.body).toMatchObject({ error: { code: 'node_lost' } })
      // Its row is still answered (its sandbox is just not known to be warm), and so is the list.
      expect((await api.call('GET', `/v1/sessions/${b}`)).body).toMatchObject({ id: b })
      expect((await api.call('GET', '/v1/sessions')).status).toBe(200)
      expect((await api.send(a, 'still here')).text).toBe('got still here\n')
      // No new session goes to the lost node.
      for (let i = 0; i < 4; i++)
        expect(await nodeOf((await api.createSession('echo')).id)).not.toBe(lostNode)
    } finally {
      // The node comes back (same runtime ID, a new incarnation): its sessions are served again.
      await registerNode(lostNode)
    }
    await pastCaches()
    expect((await api.send(b, 'back again')).text).toBe('got back again\n')
  }, 120_000)

  it('serves every session from either replica: no session_elsewhere; a cancel through one ends a turn relayed by the other', async () => {
    const id = (await api.createSession('echo')).id
    expect((await api2.send(id, 'via two')).text).toBe('got via two\n')
    expect((await api.send(id, 'via one')).text).toBe('got via one\n')
    expect((await api2.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)).body).toBe(
      'via two\nvia one\n',
    )
    expect((await api.deploy(await makeProject(SLOW))).status).toBe(201)
    const slow = (await api.createSession('slow')).id
    const sending = api.send(slow, 'long')
    for (let i = 0; i < 100; i++) {
      const { rows } = await client.query(`SELECT status FROM turns WHERE session_id = $1`, [slow])
      if (rows[0]?.status === 'running') break
      await new Promise((r) => setTimeout(r, 50))
    }
    // Wait for the agent to be in its turn (it says "working" first), then cancel through replica 2.
    await new Promise((r) => setTimeout(r, 500))
    expect((await api2.call('POST', `/v1/sessions/${slow}/cancel`)).body).toEqual({ ok: true })
    const result = await sending
    expect(result.terminal).toMatchObject({ type: 'run.cancelled' })
    const { rows } = await client.query(`SELECT status FROM turns WHERE session_id = $1`, [slow])
    expect(rows).toEqual([{ status: 'cancelled' }])
  }, 120_000)

  it("times out a node's idle session from the leader's sweep, stopping its sandbox there", async () => {
    const id = (await api.createSession('echo', { policy: { idleTimeoutMs: 1000 } })).id
    expect((await api.send(id, 'then idle')).text).toBe('got then idle\n')
    const home = ports.get(await nodeOf(id)) as LocalRuntimePort
    expect(await home.agent(id)).toBeDefined()
    let status = ''
    for (let i = 0; i < 100 && status !== 'timeout'; i++) {
      await new Promise((r) => setTimeout(r, 100))
      status = (await api.call('GET', `/v1/sessions/${id}`)).body.status
    }
    expect(status).toBe('timeout')
    const { rows } = await client.query('SELECT status_cause FROM sessions WHERE id = $1', [id])
    expect(rows[0].status_cause).toBe('idle_timeout')
    expect(await home.agent(id)).toBeUndefined()
  }, 60_000)

  it("takes the sandbox a turn's end left warm without asking its node; one gone since starts cold as a cold message does", async () => {
    const id = (await api.createSession('echo')).id
    const coldStart = (result: RunResult) =>
      result.events.find((e) => e.type === 'run.started' && 'coldStart' in e && e.coldStart)
    expect((await api.send(id, 'one')).text).toBe('got one\n')
    calls.length = 0
    const warm = await api.send(id, 'two')
    expect(warm.text).toBe('got two\n')
    expect(coldStart(warm)).toBeUndefined()
    // The turn's own call is the only one before the agent answers: no `agent` look first.
    expect(calls[0]).toBe('runTurn')
    expect(calls).not.toContain('agent')

    // Stopped behind this replica's back (through another replica, by the tenant's cap): the
    // turn's resume finds none, and the turn is admitted under the cap and checks the workspace
    // before it starts one, as a message that saw it cold would have.
    const home = ports.get(await nodeOf(id)) as LocalRuntimePort
    await home.stopAgent(id)
    calls.length = 0
    const again = await api.send(id, 'three')
    expect(again.text).toBe('got three\n')
    expect(coldStart(again)).toBeDefined()
    const order = ['runTurn', 'admitAgent', 'readGenerations', 'startAgent', 'runTurn']
    expect(calls.filter((name) => order.includes(name))).toEqual(order)
    const last = await client.query('SELECT sandbox_id FROM turns WHERE session_id = $1 AND seq = 3', [id])
    expect(last.rows[0].sandbox_id).toBe((await home.agent(id))?.sandboxId)

    // Under another owner epoch (a move, a node lost and back) the node is asked again.
    await client.query('UPDATE sessions SET owner_epoch = owner_epoch + 1 WHERE id = $1', [id])
    await pastCaches()
    calls.length = 0
    expect((await api.send(id, 'four')).text).toBe('got four\n')
    expect(calls).toContain('agent')
  }, 120_000)

  it("records nothing of a turn whose session's owner epoch changed while it ran", async () => {
    const id = (await api.createSession('slow')).id
    const sending = api.send(id, 'one')
    // Once the turn runs, the leader declares its owner lost (the epoch goes up).
    for (let i = 0; i < 100; i++) {
      const { rows } = await client.query(`SELECT status FROM turns WHERE session_id = $1`, [id])
      if (rows[0]?.status === 'running') break
      await new Promise((r) => setTimeout(r, 50))
    }
    await client.query('UPDATE sessions SET owner_epoch = owner_epoch + 1 WHERE id = $1', [id])
    const result = await sending
    expect(result.terminal).toMatchObject({ type: 'run.failed', error: { code: 'node_lost' } })
    const { rows } = await client.query(
      `SELECT t.status AS turn, t.response, s.status AS session FROM turns t JOIN sessions s ON s.id = t.session_id WHERE t.session_id = $1`,
      [id],
    )
    // Left as the turn began: the leader, not this late owner, ends it.
    expect(rows).toEqual([{ turn: 'running', response: '', session: 'active' }])
  }, 120_000)

  it("a node that dies mid-turn: the leader fails the turn node_lost, and the node's late end changes nothing", async () => {
    const id = (await api.createSession('slow')).id
    const home = await nodeOf(id)
    const sending = api.send(id, 'two')
    for (let i = 0; i < 100; i++) {
      const { rows } = await client.query(`SELECT status FROM turns WHERE session_id = $1`, [id])
      if (rows[0]?.status === 'running') break
      await new Promise((r) => setTimeout(r, 50))
    }
    // The node's liveness lock goes (its process "died"); its sandbox here runs on and answers late.
    await crashNode(home)
    try {
      const result = await sending
      expect(result.terminal, JSON.stringify(result)).toMatchObject({
        type: 'run.failed',
        error: { code: 'node_lost' },
      })
      const { rows } = await client.query(
        `SELECT t.status AS turn, t.response, t.error_code, s.status_cause FROM turns t JOIN sessions s ON s.id = t.session_id WHERE t.session_id = $1`,
        [id],
      )
      // The leader's record stands; the agent's late reply ("done two") is nowhere.
      expect(rows).toEqual([
        { turn: 'failed', response: '', error_code: 'node_lost', status_cause: 'node_lost' },
      ])
    } finally {
      await registerNode(home)
    }
  }, 120_000)
})
