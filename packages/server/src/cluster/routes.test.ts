import { Cairn, PermissionDeniedError } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, spawnCli } from '../../../../test/helpers/cli.js'
import { TestPostgres } from '../../../../test/helpers/postgres.js'
import { startTestServer, type TestServer } from '../../../../test/helpers/server.js'
import { eventually, quietLogger, seedSessions } from '../../test/cluster-rows.js'
import { type Db, openDatabase } from '../db/database.js'
import { NodeRegistry } from './node-registry.js'

// The operators' side of a cluster: /v1/nodes, cordon/uncordon/drain, the nodes in /v1/runtime
// and /metrics, and `cairn nodes`, on a real server over a real PostgreSQL.
let postgres: TestPostgres
let db: Db
let t: TestServer
let admin: Cairn
let url: string

beforeAll(async () => {
  assertBuilt()
  postgres = await TestPostgres.start()
  url = await postgres.createDatabase()
  t = await startTestServer({ server: { database: url } })
  db = await openDatabase(url)
  admin = new Cairn({ baseUrl: t.url, apiKey: t.key })
}, 120_000)

afterAll(async () => {
  for (const registry of registries) await registry.stop()
  await t?.close()
  await db?.close()
  await postgres?.stop()
})

const FIGURES = {
  drivers: ['bwrap', 'gvisor'],
  cpus: 4,
  warmSandboxes: 2,
  poolFreeBytes: 5e9,
  poolSizeBytes: 1e10,
}

const registries: NodeRegistry[] = []

/** A live node as `cairn node` registers one (its lock held, heartbeats), without a runtime. */
async function registerNode(id: string): Promise<NodeRegistry> {
  const registry = new NodeRegistry({
    db,
    databaseUrl: url,
    nodeId: id,
    name: `node-${id.slice(-4)}`,
    address: `https://10.0.0.${id.length}:7443`,
    figures: async () => FIGURES,
    stopAllAgents: async () => {},
    logger: quietLogger,
    heartbeatMs: 200,
    leaseMs: 60_000,
  })
  registries.push(registry)
  await registry.start()
  return registry
}

describe('cluster nodes over the API', () => {
  it('lists nodes (install admin only), cordons, drains and uncordons them; a lost node cannot be', async () => {
    await registerNode('rt_ops1')
    const { sessions, turns } = await seedSessions(db, 'rt_ops1', ['active', 'idle'])
    expect(sessions).toHaveLength(2)
    const [node] = await admin.nodes.list()
    expect(node).toMatchObject({
      id: 'rt_ops1',
      state: 'ready',
      epoch: 1,
      drivers: ['bwrap', 'gvisor'],
      cpus: 4,
      warmSandboxes: 2,
      poolFreeBytes: 5e9,
      sessions: 2,
      runningTurns: 1,
      leaseLive: true,
    })

    const readKey = await admin.keys.create({ role: 'read' })
    const reader = new Cairn({ baseUrl: t.url, apiKey: readKey.key })
    await expect(reader.nodes.list()).rejects.toBeInstanceOf(PermissionDeniedError)
    await expect(reader.nodes.cordon('rt_ops1')).rejects.toBeInstanceOf(PermissionDeniedError)
    // A reader's /v1/runtime has no nodes; the admin's has them.
    const asReader = (await (
      await fetch(`${t.url}/v1/runtime`, { headers: { authorization: `Bearer ${readKey.key}` } })
    ).json()) as Record<string, unknown>
    expect(asReader.nodes).toBeUndefined()
    const asAdmin = (await (
      await fetch(`${t.url}/v1/runtime`, { headers: { authorization: `Bearer ${t.key}` } })
    ).json()) as { nodes: { id: string; state: string }[] }
    expect(asAdmin.nodes.map((n) => [n.id, n.state])).toEqual([['rt_ops1', 'ready']])

    expect((await admin.nodes.cordon('rt_ops1')).state).toBe('cordoned')
    expect((await admin.nodes.drain('rt_ops1')).state).toBe('draining')
    // Twice is the same.
    expect((await admin.nodes.drain('rt_ops1')).state).toBe('draining')
    expect((await admin.nodes.uncordon('rt_ops1')).state).toBe('ready')
    // Heartbeats keep what the operator said.
    await admin.nodes.cordon('rt_ops1')
    const beat = (await admin.nodes.list())[0]?.heartbeatAt
    await eventually(async () => (await admin.nodes.list())[0]?.heartbeatAt !== beat)
    expect((await admin.nodes.list())[0]).toMatchObject({ state: 'cordoned', epoch: 1, leaseLive: true })
    await admin.nodes.uncordon('rt_ops1')

    const metrics = await (await fetch(`${t.url}/metrics`)).text()
    expect(metrics).toContain('cairn_node_up{node="rt_ops1"} 1')
    expect(metrics).toContain('cairn_node_turns_running{node="rt_ops1"} 1')
    expect(metrics).toContain('cairn_node_pool_free_bytes{node="rt_ops1"} 5000000000')
    expect(metrics).toContain('cairn_node_state{node="rt_ops1",state="ready"} 1')

    const missing = await fetch(`${t.url}/v1/nodes/rt_nope/drain`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.key}` },
    })
    expect(missing.status).toBe(404)
    expect(await missing.json()).toMatchObject({ error: { code: 'not_found' } })
    // A node whose process is gone (its lock free): the server, leader of its cluster, declares it lost.
    await (await registerNode('rt_gone')).stop()
    await db.q.updateTable('nodes').set({ state: 'ready' }).where('id', '=', 'rt_gone').execute()
    await eventually(async () => (await admin.nodes.list()).find((n) => n.id === 'rt_gone')?.state === 'lost')
    const lost = await fetch(`${t.url}/v1/nodes/rt_gone/cordon`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.key}` },
    })
    expect(lost.status).toBe(409)
    expect(await lost.json()).toMatchObject({ error: { code: 'conflict', details: { state: 'lost' } } })
    expect(turns).toHaveLength(1)
  })

  it('`cairn nodes drain` waits until the node owns no session and runs no turn; a timeout exits 1', async () => {
    await registerNode('rt_drain')
    const { turns } = await seedSessions(db, 'rt_drain', ['active'])
    const env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key }
    const timedOut = await spawnCli(['nodes', 'drain', 'rt_drain', '--timeout', '1500ms'], env).done
    expect(timedOut.code).toBe(1)
    expect(timedOut.stderr).toMatch(/still owns 1 session\(s\) and runs 1 turn/)
    const drain = spawnCli(['nodes', 'drain', 'rt_drain', '--json'], env)
    let exited = false
    void drain.done.then(() => {
      exited = true
    })
    await new Promise((resolve) => setTimeout(resolve, 2500))
    expect(exited).toBe(false)
    await db.q
      .updateTable('turns')
      .set({ status: 'completed', ended_at: new Date().toISOString() })
      .where('id', '=', turns[0] as string)
      .execute()
    // The turn ended; the node still owns the session until it is moved (an API replica's leader
    // moves it; this server has a local runtime: the row changes as a move's transaction changes it).
    await new Promise((resolve) => setTimeout(resolve, 2500))
    expect(exited).toBe(false)
    await db.q
      .updateTable('sessions')
      .set((eb) => ({ runtime_id: 'rt_elsewhere', owner_epoch: eb('owner_epoch', '+', 1) }))
      .where('runtime_id', '=', 'rt_drain')
      .execute()
    const done = await drain.done
    expect(done.stderr).toBe('')
    expect(done.code).toBe(0)
    expect(JSON.parse(done.stdout)).toMatchObject({
      id: 'rt_drain',
      state: 'draining',
      runningTurns: 0,
      sessions: 0,
    })
    const list = await spawnCli(['nodes', 'list'], env).done
    expect(list.code).toBe(0)
    expect(list.stdout).toMatch(/rt_drain\s+node-rain\s+draining/)
    const none = await spawnCli(['nodes', 'cordon', 'rt_none'], env).done
    expect(none.code).toBe(1)
    expect(none.stderr).toMatch(/no node rt_none/)
  })
})
