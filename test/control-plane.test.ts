import { createHash } from 'node:crypto'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import BetterSqlite3 from 'better-sqlite3'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { AgentStore } from '../packages/server/src/agents/agent-store.js'
import { ApiKeyStore } from '../packages/server/src/auth/api-keys.js'
import { type Db, openDatabase } from '../packages/server/src/db/database.js'
import { MIGRATIONS } from '../packages/server/src/db/migrations/index.js'
import { SecretCipher } from '../packages/server/src/secrets/cipher.js'
import { SecretStore } from '../packages/server/src/secrets/secret-store.js'
import { SessionStore } from '../packages/server/src/sessions/session-store.js'
import { SnapshotStore } from '../packages/server/src/snapshots/snapshot-store.js'
import { TestPostgres } from './helpers/postgres.js'

const clock = { now: () => Date.parse('2026-01-02T03:04:05.000Z') }
const T0 = '2026-01-01T00:00:00.000Z'
const KEY = 'cairn_sk_thekeyanolderinstallhanded0ut'
const RUNTIME = 'rt_0000000000000000test'
const TABLES = [
  'tenants',
  'api_keys',
  'agents',
  'revisions',
  'sessions',
  'turns',
  'session_events',
  'secrets',
  'snapshots',
  'retention_policies',
  'retention_events',
  'network_events',
  'agent_memory',
  'artifacts',
  'session_setups',
  'preview_url_epochs',
]

let scratch = ''
beforeAll(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'cairn-control-plane-'))
})
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true })
})

/** What the code before the PostgreSQL port did: migrations 1–16 applied to cairn.db, one transaction each. */
function olderInstall(file: string, cipher: SecretCipher): void {
  const raw = new BetterSqlite3(file)
  raw.pragma('journal_mode = WAL')
  raw.exec(
    'CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)',
  )
  for (const migration of MIGRATIONS.filter((m) => m.version <= 16)) {
    raw.transaction(() => {
      raw.exec(migration.sql)
      raw
        .prepare('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)')
        .run(migration.version, migration.name, T0)
    })()
  }
  const sealed = cipher.seal('hunter2-the-old-value', 'agt_old/TOKEN')
  raw.exec(`
    INSERT INTO tenants VALUES ('tnt_default', 'default', '${T0}');
    INSERT INTO api_keys (id, tenant_id, hash, prefix, role, name, created_at)
      VALUES ('key_old', 'tnt_default', '${createHash('sha256').update(KEY).digest('hex')}', 'cairn_sk_thek', 'admin', 'admin', '${T0}');
    INSERT INTO agents VALUES ('agt_old', 'tnt_default', 'notes', 'rev_old', '${T0}', '${T0}', NULL);
    INSERT INTO revisions VALUES ('rev_old', 'agt_old', 'tnt_default', 'READY', 'hash', '{"resolvedCommand":["node","agent.js"],"protocol":"stdio"}', 3, 5000000000, NULL, '${T0}');
    INSERT INTO sessions (id, tenant_id, agent_id, revision_id, title, status, status_cause, turn_count, message_count, idle_timeout_ms, keep_warm_ms, created_at, updated_at, last_active_at, generation)
      VALUES ('ses_old', 'tnt_default', 'agt_old', 'rev_old', 'remember', 'active', 'turn_started', 3, 5, 600000, 30000, '${T0}', '${T0}', '${T0}', 4);
    INSERT INTO turns (id, session_id, seq, status, prompt, response, started_at, ended_at, duration_ms)
      VALUES ('trn_1', 'ses_old', 1, 'completed', 'one', 'answer one', '${T0}', '${T0}', 12),
             ('trn_2', 'ses_old', 2, 'running', 'two', '', '${T0}', NULL, NULL),
             ('trn_3', 'ses_old', 3, 'running', 'three', '', '${T0}', NULL, NULL);
    INSERT INTO session_events VALUES ('evt_c', 'ses_old', NULL, 'idle', 'created', NULL, '${T0}'),
                                      ('evt_a', 'ses_old', 'idle', 'active', 'turn_started', 'trn_1', '${T0}'),
                                      ('evt_b', 'ses_old', 'active', 'idle', 'turn_completed', 'trn_1', '${T0}');
    INSERT INTO snapshots (id, session_id, tenant_id, kind, reason, label, turn_seq, generation, created_at)
      VALUES ('snap_b', 'ses_old', 'tnt_default', 'auto', 'before_turn', NULL, 1, 1, '${T0}'),
             ('snap_a', 'ses_old', 'tnt_default', 'manual', 'manual', 'kept', 1, 2, '${T0}');
    INSERT INTO retention_policies VALUES ('tnt_default', 3, NULL, 86400000, '${T0}');
    INSERT INTO retention_events VALUES ('evt_r', 'tnt_default', 'ses_gone', 'workspace', 'ses_gone', 3000000000, 'ended_workspace_ttl', '${T0}');
    INSERT INTO network_events (session_id, at, host, port, method, allowed, reason, address)
      VALUES ('ses_old', '${T0}', 'example.com', 443, 'CONNECT', 1, 'allowed', '93.184.216.34');
    INSERT INTO agent_memory VALUES ('agt_old', 1, 'the user likes tea', 'api', '${T0}');
    INSERT INTO artifacts VALUES ('art_old', 'tnt_default', 'agt_old', 'ses_old', '/workspace/out.txt', 10, 'abc', '${T0}');
    INSERT INTO session_setups (session_id, command_json, env_json, status, attempts, log)
      VALUES ('ses_old', '["sh","-c","true"]', '{}', 'succeeded', 1, 'ok\n');
    INSERT INTO preview_url_epochs VALUES ('ses_old', 0, 2);
  `)
  raw
    .prepare(
      `INSERT INTO secrets (agent_id, tenant_id, name, scope, ciphertext, iv, tag, key_version, created_at, updated_at)
       VALUES ('agt_old', 'tnt_default', 'TOKEN', 'runtime', ?, ?, ?, ?, ?, ?)`,
    )
    .run(sealed.ciphertext, sealed.iv, sealed.tag, sealed.keyVersion, T0, T0)
  raw.close()
}

async function counts(db: Db): Promise<Record<string, number>> {
  const out: Record<string, number> = {}
  for (const table of TABLES) {
    const row = await db.kysely
      .selectFrom(table as 'tenants')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .executeTakeFirstOrThrow()
    out[table] = Number(row.n)
  }
  return out
}

describe('an install made before the PostgreSQL port', () => {
  it('opens with every row, its migrations honoured, and reads back through the stores', async () => {
    const file = path.join(scratch, 'cairn.db')
    const cipher = await SecretCipher.load(path.join(scratch, 'secret.key'), '')
    olderInstall(file, cipher)
    const before = new BetterSqlite3(file, { readonly: true })
    const rowsBefore = Object.fromEntries(
      TABLES.map((t) => [t, (before.prepare(`SELECT COUNT(*) AS n FROM ${t}`).get() as { n: number }).n]),
    )
    before.close()
    expect(rowsBefore.turns).toBe(3)

    const db = await openDatabase(file)
    try {
      // Versions 1–16 are not applied again (they would fail: their tables exist); 17 is new.
      const migrations = await db.kysely
        .selectFrom('schema_migrations')
        .selectAll()
        .orderBy('version')
        .execute()
      expect(migrations.map((m) => m.version)).toEqual(MIGRATIONS.map((m) => m.version))
      expect(migrations.filter((m) => m.version <= 16).every((m) => m.applied_at === T0)).toBe(true)
      expect(await counts(db)).toEqual(rowsBefore)

      const sessions = new SessionStore(db, RUNTIME)
      // Rows from before owners were recorded become the runtime's that starts first.
      expect(await sessions.claimUnowned()).toBe(1)
      const session = await sessions.get('tnt_default', 'ses_old')
      expect(session).toMatchObject({
        agent_name: 'notes',
        turn_count: 3,
        generation: 4,
        status: 'active',
        runtime_id: RUNTIME,
      })
      // Two running turns of one session were possible before; the older one is interrupted.
      expect((await sessions.turns('ses_old')).map((t) => [t.seq, t.status])).toEqual([
        [1, 'completed'],
        [2, 'interrupted'],
        [3, 'running'],
      ])
      // Events with the same time come back in the order they were written.
      expect((await sessions.events('ses_old')).map((e) => e.id)).toEqual(['evt_c', 'evt_a', 'evt_b'])
      const recovered = await sessions.recoverAfterRestart(T0)
      expect(recovered.turns).toEqual([{ sessionId: 'ses_old', tenantId: 'tnt_default', seq: 3 }])
      expect((await sessions.get('tnt_default', 'ses_old'))?.status).toBe('idle')

      expect(await new ApiKeyStore(db, clock).verify(KEY)).toEqual({
        keyId: 'key_old',
        tenantId: 'tnt_default',
        role: 'admin',
      })
      expect(await new SecretStore(db, cipher, clock).values('agt_old', ['runtime'])).toEqual({
        TOKEN: 'hunter2-the-old-value',
      })
      expect((await new SnapshotStore(db).list('ses_old')).map((s) => s.id)).toEqual(['snap_b', 'snap_a'])
      const agents = new AgentStore(db)
      const agent = await agents.find('tnt_default', 'notes')
      expect(agent && (await agents.toInfo(agent))).toMatchObject({ command: ['node', 'agent.js'] })
      expect((await agents.revision('rev_old'))?.sizeBytes).toBe(5_000_000_000)
    } finally {
      await db.close()
    }
    // Opened again: nothing more to migrate, nothing lost.
    const again = await openDatabase(file)
    try {
      expect((await counts(again)).turns).toBe(3)
    } finally {
      await again.close()
    }
  })
})

describe.each(['sqlite', 'postgres'] as const)('the control plane on %s', (dialect) => {
  let postgres: TestPostgres | undefined
  let db: Db
  beforeAll(async () => {
    let target = path.join(scratch, `${dialect}.db`)
    if (dialect === 'postgres') {
      postgres = await TestPostgres.start()
      target = await postgres.createDatabase()
    }
    db = await openDatabase(target)
    const keys = new ApiKeyStore(db, clock)
    await keys.ensureTenant('tnt_default', 'default')
    const agents = new AgentStore(db)
    await agents.insertAgent('agt_a', 'tnt_default', 'a', T0)
    await agents.insertRevision({
      id: 'rev_a',
      agent_id: 'agt_a',
      tenant_id: 'tnt_default',
      status: 'READY',
      content_hash: 'h',
      manifest_json: '{"resolvedCommand":["true"]}',
      file_count: 1,
      size_bytes: 6_000_000_000,
      error: null,
      created_at: T0,
    })
  }, 120_000)
  afterAll(async () => {
    await db?.close()
    await postgres?.stop()
  })

  const newSession = async (store: SessionStore, id: string) =>
    store.insert({
      id,
      tenant_id: 'tnt_default',
      agent_id: 'agt_a',
      revision_id: 'rev_a',
      title: null,
      status: 'idle',
      status_cause: 'created',
      idle_timeout_ms: 600_000,
      keep_warm_ms: 0,
      max_turns: null,
      max_duration_ms: null,
      deadline_at: null,
      on_timeout: 'keep',
      created_at: T0,
    })

  it('refuses a second running turn of one session (session_busy) and records nothing of it', async () => {
    const store = new SessionStore(db, RUNTIME)
    await newSession(store, 'ses_busy')
    await store.startTurn({
      sessionId: 'ses_busy',
      turnId: 'trn_first',
      seq: 1,
      prompt: 'one',
      title: 'one',
      at: T0,
      relayId: null,
    })
    // Both at once, as two replicas would: exactly one is refused.
    const raced = await Promise.allSettled([
      store.startTurn({
        sessionId: 'ses_busy',
        turnId: 'trn_second',
        seq: 2,
        prompt: 'two',
        title: 'two',
        at: T0,
        relayId: null,
      }),
      store.startTurn({
        sessionId: 'ses_busy',
        turnId: 'trn_third',
        seq: 2,
        prompt: 'three',
        title: 'three',
        at: T0,
        relayId: null,
      }),
    ])
    expect(raced.map((r) => r.status)).toEqual(['rejected', 'rejected'])
    for (const r of raced) expect((r as PromiseRejectedResult).reason).toMatchObject({ code: 'session_busy' })
    expect((await store.turns('ses_busy')).map((t) => t.id)).toEqual(['trn_first'])
    expect((await store.get('tnt_default', 'ses_busy'))?.turn_count).toBe(1)
    const ownerEpoch = (await store.get('tnt_default', 'ses_busy'))?.owner_epoch ?? 0
    await db.transaction(() =>
      store.finishTurn(
        { id: 'ses_busy', status: 'active', ownerEpoch },
        {
          id: 'trn_first',
          status: 'completed',
          response: 'done',
          stderr: '',
          errorCode: null,
          errorMessage: null,
          endedAt: T0,
          durationMs: 5,
        },
        { to: 'idle', cause: 'turn_completed', detail: 'trn_first', generation: undefined },
      ),
    )
    await store.startTurn({
      sessionId: 'ses_busy',
      turnId: 'trn_next',
      seq: 2,
      prompt: 'two',
      title: 'two',
      at: T0,
      relayId: null,
    })
    expect((await store.turns('ses_busy')).map((t) => [t.seq, t.status])).toEqual([
      [1, 'completed'],
      [2, 'running'],
    ])
  })

  it('keeps a transaction whole: a failure inside it leaves nothing behind', async () => {
    const store = new SessionStore(db, RUNTIME)
    await newSession(store, 'ses_atomic')
    await expect(
      db.transaction(async () => {
        await store.transition({ id: 'ses_atomic', status: 'idle' }, 'active', 'turn_started', T0)
        throw new Error('the write after it failed')
      }),
    ).rejects.toThrow('the write after it failed')
    expect((await store.get('tnt_default', 'ses_atomic'))?.status).toBe('idle')
    expect((await store.events('ses_atomic')).map((e) => e.to)).toEqual(['idle'])
  })

  it('reads 64-bit sizes and counts as numbers, and secrets as bytes', async () => {
    const agents = new AgentStore(db)
    expect((await agents.revision('rev_a'))?.sizeBytes).toBe(6_000_000_000)
    expect(await new ApiKeyStore(db, clock).count()).toBe(0)
    const cipher = await SecretCipher.load(path.join(scratch, `${dialect}.key`), '')
    const secrets = new SecretStore(db, cipher, clock)
    await secrets.set('tnt_default', 'agt_a', { A: 'first value', B: 'second' })
    await secrets.set('tnt_default', 'agt_a', { A: 'changed value' })
    expect(await secrets.values('agt_a', ['runtime'])).toEqual({ A: 'changed value', B: 'second' })
  })

  it('finds sessions by ID prefix in byte order, as SQLite compares text', async () => {
    const store = new SessionStore(db, RUNTIME)
    await newSession(store, 'ses_prefixaaa')
    await newSession(store, 'ses_prefixb')
    expect(await store.resolvePrefix('tnt_default', 'ses_prefix', 6)).toEqual([
      'ses_prefixaaa',
      'ses_prefixb',
    ])
    expect(await store.resolvePrefix('tnt_default', 'ses_prefixa', 6)).toEqual(['ses_prefixaaa'])
  })
})
