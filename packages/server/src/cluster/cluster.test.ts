import pg from 'pg'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { TestPostgres } from '../../../../test/helpers/postgres.js'
import { eventually, quietLogger, seedSessions } from '../../test/cluster-rows.js'
import { type Db, openDatabase } from '../db/database.js'
import { type ClusterHint, ClusterHints, HINTS_APPLICATION_NAME } from './cluster-hints.js'
import { ClusterLeader } from './cluster-leader.js'
import { NODE_LOCK_CLASS } from './dedicated-connection.js'
import { NodeRegistry } from './node-registry.js'
import { NodeStore } from './node-store.js'
import { deadRelayHolds, releaseDeadRelayHolds } from './relayed-turns.js'

// Registration, liveness and failure handling against a real PostgreSQL of the test's own.
let postgres: TestPostgres
let url: string
let db: Db
const closers: (() => Promise<unknown>)[] = []

beforeAll(async () => {
  postgres = await TestPostgres.start()
  url = await postgres.createDatabase()
  db = await openDatabase(url)
}, 120_000)

afterEach(async () => {
  for (const close of closers.reverse()) await close().catch(() => undefined)
  closers.length = 0
})

afterAll(async () => {
  await db?.close()
  await postgres?.stop()
})

const FIGURES = { drivers: ['bwrap'], cpus: 2, warmSandboxes: 0, poolFreeBytes: 1000, poolSizeBytes: 2000 }

function registry(nodeId: string, stops: string[], times: { heartbeatMs: number; leaseMs: number }) {
  const r = new NodeRegistry({
    db,
    databaseUrl: url,
    nodeId,
    name: nodeId,
    address: `https://${nodeId}.test:7443`,
    figures: async () => FIGURES,
    stopAllAgents: async () => {
      stops.push(nodeId)
    },
    logger: quietLogger,
    ...times,
  })
  closers.push(() => r.stop())
  return r
}

function leader(options: { checkMs: number; leaseMs: number; hints?: ClusterHints }) {
  const { hints, ...times } = options
  const l = new ClusterLeader({
    db,
    databaseUrl: url,
    logger: quietLogger,
    ...(hints ? { publish: (hint: ClusterHint) => hints.publish(hint) } : {}),
    ...times,
  })
  closers.push(() => l.stop())
  return l
}

/** The backend PIDs holding a node's liveness lock. */
async function lockHolders(nodeId: string): Promise<number[]> {
  const out = await postgres.sql(
    `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = ${NODE_LOCK_CLASS} AND objid = (hashtext('${nodeId}')::bigint & 4294967295) AND granted`,
    url.split('/').pop(),
  )
  return out ? out.split('\n').map(Number) : []
}

const store = () => new NodeStore(db)

describe('nodes in PostgreSQL', () => {
  it('two registries racing for one node ID: one registers, the other is refused; epochs count registrations', async () => {
    const stops: string[] = []
    const a = registry('rt_race', stops, { heartbeatMs: 100, leaseMs: 400 })
    const b = registry('rt_race', stops, { heartbeatMs: 100, leaseMs: 400 })
    const results = await Promise.allSettled([a.start(), b.start()])
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1)
    const rejected = results.find((r) => r.status === 'rejected') as PromiseRejectedResult
    expect(String(rejected.reason)).toMatch(/liveness lock .* is held by another connection/)
    expect(await store().get('rt_race')).toMatchObject({ state: 'ready', epoch: 1, leaseLive: true })
    // Each holds one lock at most: exactly one backend holds it.
    expect(await lockHolders('rt_race')).toHaveLength(1)
    const winner = results[0]?.status === 'fulfilled' ? a : b
    await winner.stop()
    expect(await store().get('rt_race')).toMatchObject({ state: 'stopped', epoch: 1, leaseLive: false })
    const again = registry('rt_race', stops, { heartbeatMs: 100, leaseMs: 400 })
    expect(await again.start()).toBe(2)
    await again.stop()
    expect(stops).toEqual([])
  })

  it('a lease that ends makes the node lost: sessions marked, running turn failed, a hint sent; a late heartbeat changes nothing', async () => {
    // A frozen node: it holds its lock (its connection lives) but no longer renews.
    const frozen = new pg.Client({ connectionString: url })
    frozen.on('error', () => {})
    await frozen.connect()
    closers.push(() => frozen.end())
    await frozen.query('SELECT pg_advisory_lock($1, hashtext($2))', [NODE_LOCK_CLASS, 'rt_frozen'])
    const { epoch } = await store().register({
      id: 'rt_frozen',
      name: 'frozen',
      address: 'https://frozen.test:7443',
      bootId: 'b',
      figures: FIGURES,
      leaseMs: 300,
    })
    const { sessions, turns } = await seedSessions(db, 'rt_frozen', [
      'active',
      'idle',
      'completed',
      'deleted',
    ])
    const bystander = await seedSessions(db, 'rt_bystander', ['active'])
    const hints = new ClusterHints({ db, url, logger: quietLogger })
    closers.push(() => hints.close())
    const received: ClusterHint[] = []
    await hints.subscribe((hint) => received.push(hint))

    const l = leader({ checkMs: 50, leaseMs: 200, hints })
    l.start()
    await eventually(async () => (await store().get('rt_frozen')).state === 'lost')
    const node = await store().get('rt_frozen')
    expect(node).toMatchObject({ state: 'lost', epoch, leaseLive: false, sessions: 3 })
    expect(node.lostAt).toBeDefined()

    const rows = await db.q
      .selectFrom('sessions')
      .select(['id', 'status', 'status_cause', 'owner_epoch'])
      .where('id', 'in', [...sessions, ...bystander.sessions])
      .execute()
    const byId = new Map(rows.map((r) => [r.id, r]))
    const [active, idle, completed, deleted] = sessions.map((id) => byId.get(id))
    expect(active).toMatchObject({ status: 'idle', status_cause: 'node_lost', owner_epoch: 1 })
    expect(idle).toMatchObject({ status: 'idle', status_cause: 'node_lost', owner_epoch: 1 })
    expect(completed).toMatchObject({ status: 'completed', status_cause: 'node_lost', owner_epoch: 1 })
    expect(deleted).toMatchObject({ status: 'deleted', status_cause: 'created', owner_epoch: 0 })
    // Another node's session does not notice.
    expect(byId.get(bystander.sessions[0] as string)).toMatchObject({
      status: 'active',
      status_cause: 'turn_started',
      owner_epoch: 0,
    })
    const turn = await db.q
      .selectFrom('turns')
      .selectAll()
      .where('id', '=', turns[0] as string)
      .executeTakeFirstOrThrow()
    expect(turn).toMatchObject({ status: 'failed', error_code: 'node_lost' })
    expect(turn.ended_at).not.toBeNull()
    const events = await db.q
      .selectFrom('session_events')
      .select(['session_id', 'from_status', 'to_status'])
      .where('cause', '=', 'node_lost')
      .where('session_id', 'in', sessions)
      .execute()
    expect(events).toHaveLength(3)
    expect(events.find((e) => e.session_id === sessions[0])).toMatchObject({
      from_status: 'active',
      to_status: 'idle',
    })
    const hint = await eventually(async () => received.find((h) => h.kind === 'node.lost'))
    expect(hint).toEqual({
      kind: 'node.lost',
      nodeId: 'rt_frozen',
      epoch,
      turns: [{ sessionId: sessions[0], turnId: turns[0] }],
    })

    // The node wakes up and renews, late: its incarnation no longer holds a lease.
    const before = await store().get('rt_frozen')
    expect(
      await store().renew('rt_frozen', epoch, 5000, { warmSandboxes: 3, poolFreeBytes: 1 }),
    ).toBeUndefined()
    expect(await store().get('rt_frozen')).toEqual(before)
    // Declaring it lost again changes nothing either (once per incarnation).
    const again = await db.q
      .selectFrom('sessions')
      .select('owner_epoch')
      .where('id', '=', sessions[1] as string)
      .executeTakeFirstOrThrow()
    expect(again.owner_epoch).toBe(1)

    // It registers again: a new epoch, ready, and its sessions are its own still.
    await frozen.query('SELECT 1')
    const back = await store().register({
      id: 'rt_frozen',
      name: 'frozen',
      address: 'https://frozen.test:7443',
      bootId: 'b',
      figures: FIGURES,
      leaseMs: 60_000,
    })
    expect(back).toEqual({ epoch: epoch + 1, state: 'ready' })
    expect(await store().get('rt_frozen')).toMatchObject({ state: 'ready', sessions: 3 })
    await store().deregister('rt_frozen', epoch + 1)
    await l.stop()
  })

  it('a node whose connection dies is lost at once; it fences itself, then registers again and keeps its sessions', async () => {
    const stops: string[] = []
    const fences: boolean[] = []
    const r = new NodeRegistry({
      db,
      databaseUrl: url,
      nodeId: 'rt_crash',
      name: 'crash',
      address: 'https://crash.test:7443',
      figures: async () => FIGURES,
      stopAllAgents: async () => {
        stops.push('rt_crash')
      },
      onFenceChange: (fenced) => fences.push(fenced),
      logger: quietLogger,
      // Long lease and slow heartbeats: only the lock can tell the leader first.
      heartbeatMs: 1500,
      leaseMs: 30_000,
    })
    closers.push(() => r.stop())
    expect(await r.start()).toBeGreaterThanOrEqual(1)
    const { sessions } = await seedSessions(db, 'rt_crash', ['idle'])
    const l = leader({ checkMs: 25, leaseMs: 100 })
    l.start()
    await eventually(async () => l.isLeader)
    await new Promise((resolve) => setTimeout(resolve, 150))
    const [pid] = await lockHolders('rt_crash')
    await postgres.sql(`SELECT pg_terminate_backend(${pid})`)
    await eventually(async () => (await store().get('rt_crash')).state === 'lost', 5000)
    // At its next heartbeat the node finds its incarnation gone: it stops its sandboxes...
    await eventually(async () => stops.length > 0, 5000)
    // ...and registers again with the next epoch; the session it owned is its own.
    const node = await eventually(async () => {
      const n = await store().get('rt_crash')
      return n.state === 'ready' && n.epoch === 2 ? n : undefined
    }, 5000)
    expect(node.sessions).toBe(1)
    expect(r.isFenced()).toBe(false)
    expect(fences).toEqual([false, true, false])
    const row = await db.q
      .selectFrom('sessions')
      .select(['runtime_id', 'owner_epoch'])
      .where('id', '=', sessions[0] as string)
      .executeTakeFirstOrThrow()
    expect(row).toEqual({ runtime_id: 'rt_crash', owner_epoch: 1 })
    await l.stop()
    await r.stop()
  })

  it("a new incarnation keeps an operator's cordon, not a drain (every stop drains first)", async () => {
    const node = {
      id: 'rt_states',
      name: 'states',
      address: 'https://states.test:7443',
      bootId: 'b',
      figures: FIGURES,
      leaseMs: 60_000,
    }
    expect(await store().register(node)).toEqual({ epoch: 1, state: 'ready' })
    await store().apply('rt_states', 'drain')
    expect(await store().register(node)).toEqual({ epoch: 2, state: 'ready' })
    await store().apply('rt_states', 'drain')
    await store().apply('rt_states', 'cordon')
    expect(await store().register(node)).toEqual({ epoch: 3, state: 'cordoned' })
    expect(await store().deregister('rt_states', 2)).toBe(false)
    expect(await store().deregister('rt_states', 3)).toBe(true)
    expect(await store().register(node)).toEqual({ epoch: 4, state: 'ready' })
    await store().deregister('rt_states', 4)
  })

  it("the leader lock moves when its holder's connection dies", async () => {
    const one = leader({ checkMs: 50, leaseMs: 5000 })
    const two = leader({ checkMs: 50, leaseMs: 5000 })
    one.start()
    two.start()
    const first = await eventually(async () => (one.isLeader ? one : two.isLeader ? two : undefined))
    const other = first === one ? two : one
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(first.isLeader && other.isLeader).toBe(false)
    expect(other.isLeader).toBe(false)
    const holder = await postgres.sql(
      `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = ${0x636c6472} AND granted`,
      url.split('/').pop(),
    )
    await postgres.sql(`SELECT pg_terminate_backend(${holder})`)
    // Freed with its connection and taken again on another: usually by the other process, but the
    // first one's new connection may win the race (it did on a loaded CI machine); never both.
    const holderNow = async () =>
      postgres.sql(
        `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = ${0x636c6472} AND granted`,
        url.split('/').pop(),
      )
    await eventually(async () => (one.isLeader || two.isLeader) && (await holderNow()) !== holder, 5000)
    expect(one.isLeader && two.isLeader).toBe(false)
    await one.stop()
    await two.stop()
  })

  it('hints: a listener that may have missed one says so (a new stretch), cut off or hung, and listens again', async () => {
    const hints = new ClusterHints({ db, url, logger: quietLogger, reconnectMs: 100, probeMs: 100 })
    closers.push(() => hints.close())
    let resumed = 0
    hints.onResumed(() => resumed++)
    const received: ClusterHint[] = []
    await hints.subscribe((hint) => received.push(hint))
    const first = hints.continuity
    expect(first).toBeDefined()
    expect(resumed).toBe(1)
    const listener = async () =>
      Number(
        await postgres.sql(
          `SELECT pid FROM pg_stat_activity WHERE application_name = '${HINTS_APPLICATION_NAME}'`,
          url.split('/').pop(),
        ),
      )
    // Cut off: the connection ends.
    await postgres.sql(`SELECT pg_terminate_backend(${await listener()})`)
    await eventually(async () => hints.continuity !== undefined && resumed === 2, 5000)
    expect(hints.continuity).not.toBe(first)
    // Hung: the connection stays open and says nothing (a partition); the probe times out.
    const second = hints.continuity
    const hung = await listener()
    process.kill(hung, 'SIGSTOP')
    try {
      await eventually(async () => hints.continuity !== second, 15_000)
    } finally {
      process.kill(hung, 'SIGCONT')
    }
    await eventually(async () => hints.continuity !== undefined && resumed === 3, 10_000)
    await hints.publish({ kind: 'key.revoke', keyId: 'key_after' })
    await eventually(async () => received.some((h) => h.kind === 'key.revoke' && h.keyId === 'key_after'))
  }, 60_000)

  it('a PostgreSQL restart longer than a lease makes no live node lost: the leader judges leases a lease after it leads again', async () => {
    const stops: string[] = []
    // The node renews more slowly than the leader checks, so the leader's first round after the
    // restart comes before the node's registration: it used to declare the node lost then.
    const r = registry('rt_blip', stops, { heartbeatMs: 250, leaseMs: 600 })
    await r.start()
    const { sessions } = await seedSessions(db, 'rt_blip', ['idle'])
    const l = leader({ checkMs: 50, leaseMs: 600 })
    l.start()
    await eventually(async () => l.isLeader)
    await postgres.stopServer()
    try {
      await eventually(async () => r.isFenced(), 3000)
    } finally {
      await postgres.startServer()
    }
    await eventually(async () => !r.isFenced() && l.isLeader, 15_000)
    // Past the leader's wait: a lease it would judge by has come and gone.
    await new Promise((resolve) => setTimeout(resolve, 1000))
    expect(await store().get('rt_blip')).toMatchObject({ state: 'ready', epoch: 2, leaseLive: true })
    const [session] = await db.q
      .selectFrom('sessions')
      .select(['status_cause', 'owner_epoch'])
      .where('id', '=', sessions[0] as string)
      .execute()
    expect(session).toMatchObject({ status_cause: 'created', owner_epoch: 0 })
    expect(stops).toEqual(['rt_blip'])
  })

  it('a node fences itself when PostgreSQL stops, and registers with a new epoch when it is back', async () => {
    const stops: string[] = []
    const r = registry('rt_fence', stops, { heartbeatMs: 100, leaseMs: 600 })
    expect(await r.start()).toBe(1)
    await postgres.stopServer()
    try {
      await eventually(async () => r.isFenced(), 3000)
      expect(stops).toEqual(['rt_fence'])
    } finally {
      await postgres.startServer()
    }
    await eventually(async () => !r.isFenced(), 15_000)
    expect(r.epoch).toBe(2)
    expect(await store().get('rt_fence')).toMatchObject({ state: 'ready', epoch: 2, leaseLive: true })
    await r.stop()
  })
})

describe("the leader's pass over lost replicas (every second)", () => {
  it("releases dead replicas' session holds, found through an index of the held sessions, not by reading every session", async () => {
    const { sessions } = await seedSessions(db, 'rt_holds', ['idle', 'idle', 'idle'])
    const [live, dead, free] = sessions as [string, string, string]
    const now = Date.now()
    const iso = (ms: number) => new Date(now + ms).toISOString()
    await db.q
      .insertInto('replicas')
      .values([
        { id: 'rpl_holdlive', replica_id: 'rep_a', started_at: iso(-60_000), lease_until: iso(60_000) },
        { id: 'rpl_holddead', replica_id: 'rep_b', started_at: iso(-60_000), lease_until: iso(-30_000) },
      ])
      .execute()
    const hold = async (id: string, token: string) =>
      db.q
        .updateTable('sessions')
        .set({ held_for: 'snapshot', held_by: token, held_until: iso(60_000) })
        .where('id', '=', id)
        .execute()
    await hold(live, 'rpl_holdlive/k1')
    await hold(dead, 'rpl_holddead/k2')

    // With sequential scans priced out, the planner shows whether anything else can serve the
    // statement: without the index it reads the whole sessions table all the same.
    const { sql, parameters } = deadRelayHolds(db).compile()
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      await client.query('SET enable_seqscan = off')
      const plan = await client.query(`EXPLAIN ${sql}`, parameters as unknown[])
      const text = plan.rows.map((row) => row['QUERY PLAN'] as string).join('\n')
      expect(text).not.toMatch(/Seq Scan on sessions/)
      expect(text).toMatch(/sessions_held/)
    } finally {
      await client.end()
    }

    expect(await releaseDeadRelayHolds(db)).toBe(1)
    const rows = await db.q
      .selectFrom('sessions')
      .select(['id', 'held_by'])
      .where('id', 'in', [live, dead, free])
      .execute()
    const heldBy = Object.fromEntries(rows.map((row) => [row.id, row.held_by]))
    expect(heldBy).toEqual({ [live]: 'rpl_holdlive/k1', [dead]: null, [free]: null })
  })
})
