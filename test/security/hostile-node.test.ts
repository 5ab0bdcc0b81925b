import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { NodeStore } from '../../packages/server/src/cluster/node-store.js'
import { type Db, openDatabase } from '../../packages/server/src/db/database.js'
import { recordShippedAsNode } from '../../packages/server/src/node/shipped-record.js'
import { seedSessions } from '../../packages/server/test/cluster-rows.js'
import { nodeDatabaseUrl } from '../helpers/node-role.js'
import { TestPostgres } from '../helpers/postgres.js'

// A compromised node holds its `--database` credential (issue 28 item 8). With it, it read the
// secrets key from `shared_files`, tenants' prompts from `turns`, wrote an admin key into
// `api_keys`, and its writes were fenced only by its own code. A node's role holds what its
// sessions need and nothing more (node-role.ts); fencing is the database's. No sandboxes here:
// the node's credential against a real PostgreSQL, through the node's own store code where it has
// one, raw SQL for what it should never do.

let postgres: TestPostgres
let owner: Db
let hostile: Db
let other: Db
let raw: pg.Client
const NODE = 'rt_hostilenode'
const OTHER_NODE = 'rt_othernode'
const LEASE_MS = 60_000

const figures = { drivers: ['bwrap'], cpus: 2, warmSandboxes: 0, poolFreeBytes: 1, poolSizeBytes: 2 }
const registration = (id: string) => ({
  id,
  name: id,
  address: 'https://10.0.0.9:7443',
  bootId: 'boot',
  figures,
  leaseMs: LEASE_MS,
})

/** The SQLSTATE a statement failed with, or `ran` (42501: insufficient_privilege). */
async function sqlState(statement: string, values: unknown[] = []): Promise<string> {
  return raw.query(statement, values).then(
    () => 'ran',
    (error: { code?: string }) => error.code ?? String(error),
  )
}

const ship = (sessionId: string, ownerEpoch: number, generation: number) => ({
  sessionId,
  ownerEpoch,
  generation,
  snapshotId: `snap_g${generation}`,
  shippedAt: new Date().toISOString(),
  seq: generation,
  treeDigest: 'sha256:0',
})

beforeAll(async () => {
  postgres = await TestPostgres.start()
  const url = await postgres.createDatabase()
  const nodeUrl = await nodeDatabaseUrl(postgres, url, { role: 'cairn_node_hostile' })
  const otherUrl = await nodeDatabaseUrl(postgres, url, { role: 'cairn_node_other' })
  owner = await openDatabase(url)
  hostile = await openDatabase(nodeUrl, { migrate: false })
  other = await openDatabase(otherUrl, { migrate: false })
  raw = new pg.Client({ connectionString: nodeUrl })
  await raw.connect()
}, 60_000)

afterAll(async () => {
  await raw?.end()
  for (const db of [hostile, other, owner]) await db?.close()
  await postgres?.stop()
})

describe("a compromised node's database credential", () => {
  it('reads neither the secrets key nor a tenant’s rows; the egress CA is all it gets of the shared files', async () => {
    await seedSessions(owner, OTHER_NODE, ['active'])
    expect(await sqlState("SELECT content FROM shared_files WHERE name = 'secret.key'")).toBe('42501')
    expect(await sqlState('SELECT prompt FROM turns')).toBe('42501')
    expect(await sqlState('SELECT ciphertext FROM secrets')).toBe('42501')
    expect(await sqlState('SELECT hash FROM api_keys')).toBe('42501')
    expect(await sqlState('SELECT tenant_id, title FROM sessions')).toBe('42501')
    const { rows } = await raw.query('SELECT name FROM node_shared_files')
    expect(rows.map((r) => r.name)).toEqual(['egress-ca'])
  })

  it('writes no table: no admin key, no owner epoch, no other node', async () => {
    const [sessionId] = (await seedSessions(owner, NODE, ['idle'])).sessions
    const at = new Date().toISOString()
    expect(
      await sqlState(
        "INSERT INTO api_keys (id, tenant_id, hash, prefix, role, created_at) SELECT 'key_evil', tenant_id, 'h', 'p', 'admin', $1 FROM sessions LIMIT 1",
        [at],
      ),
    ).toBe('42501')
    expect(
      await sqlState('UPDATE sessions SET owner_epoch = owner_epoch + 1 WHERE id = $1', [sessionId]),
    ).toBe('42501')
    expect(await sqlState('UPDATE sessions SET shipped_generation = 99 WHERE id = $1', [sessionId])).toBe(
      '42501',
    )
    expect(await sqlState("UPDATE nodes SET state = 'ready'")).toBe('42501')
    expect(await sqlState("INSERT INTO shared_files (name, content, created_at) VALUES ('x', '', '')")).toBe(
      '42501',
    )
    expect(await sqlState('CREATE TABLE evil (x int)')).toBe('42501')
  })

  it('registers and renews as itself only; its writes are fenced by the database, not by its own code', async () => {
    const [sessionId] = (await seedSessions(owner, NODE, ['idle'])).sessions as [string]
    await owner.q.updateTable('sessions').set({ owner_epoch: 2 }).where('id', '=', sessionId).execute()
    const store = new NodeStore(hostile)
    const { epoch } = await store.register(registration(NODE))
    expect(await store.renew(NODE, epoch, LEASE_MS, figures)).toBe('ready')
    // Another node's role may not take the row over, renew it or stop it.
    await expect(new NodeStore(other).register(registration(NODE))).rejects.toMatchObject({ code: '42501' })
    expect(await new NodeStore(other).renew(NODE, epoch, LEASE_MS, figures)).toBeUndefined()
    expect(await new NodeStore(other).deregister(NODE, epoch)).toBe(false)
    expect(await recordShippedAsNode(other, NODE, ship(sessionId, 2, 1))).toBe(false)
    // The owner, live, at the session's epoch: recorded.
    expect(await recordShippedAsNode(hostile, NODE, ship(sessionId, 2, 1))).toBe(true)
    // The session moved on (epoch 3): the old epoch's write changes nothing.
    await owner.q.updateTable('sessions').set({ owner_epoch: 3 }).where('id', '=', sessionId).execute()
    expect(await recordShippedAsNode(hostile, NODE, ship(sessionId, 2, 2))).toBe(false)
    // Its lease ended (it did not fence itself): nothing, even at the current epoch.
    await owner.q
      .updateTable('nodes')
      .set({ lease_expires_at: '2000-01-01T00:00:00.000Z' })
      .where('id', '=', NODE)
      .execute()
    expect(await recordShippedAsNode(hostile, NODE, ship(sessionId, 3, 3))).toBe(false)
    // Declared lost: no renewal, no write.
    await owner.q.updateTable('nodes').set({ state: 'lost' }).where('id', '=', NODE).execute()
    expect(await store.renew(NODE, epoch, LEASE_MS, figures)).toBeUndefined()
    expect(await recordShippedAsNode(hostile, NODE, ship(sessionId, 3, 3))).toBe(false)
    const row = await owner.q
      .selectFrom('sessions')
      .select(['shipped_generation', 'owner_epoch'])
      .where('id', '=', sessionId)
      .executeTakeFirstOrThrow()
    expect(row).toEqual({ shipped_generation: 1, owner_epoch: 3 })
    // The other node registers its own ID as itself.
    expect((await new NodeStore(other).register(registration(OTHER_NODE))).epoch).toBe(1)
  })
})
