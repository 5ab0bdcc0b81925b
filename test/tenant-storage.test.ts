import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { KEPT_ENDED_COMMANDS } from '@cairn/protocol'
import type { CommandState } from '@cairn/runtime/port'
import fc from 'fast-check'
import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { CommandStore } from '../packages/server/src/commands/command-store.js'
import { type Db, openDatabase } from '../packages/server/src/db/database.js'
import { insertEvents } from '../packages/server/src/sessions/turn-events.js'
import { TurnRecords } from '../packages/server/src/sessions/turn-records.js'
import { testDatabaseUrl } from './helpers/postgres.js'

// The per-tenant byte counters (`tenant_storage`, kept by triggers) against a model of what each
// tenant stores, over random sequences of writes, deletes and retention run a few at a time
// concurrently (separate connections on PostgreSQL), and against a full scan of the rows.
let dir = ''
let db: Db
const TENANTS = ['tnt_a', 'tnt_b'] as const
const SESSIONS_PER_TENANT = 3
const now = '2026-11-29T00:00:00.000Z'

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-tenant-storage-'))
  db = await openDatabase((await testDatabaseUrl()) ?? path.join(dir, 'cairn.db'))
  for (const tenant of TENANTS) {
    await db.q.insertInto('tenants').values({ id: tenant, name: tenant, created_at: now }).execute()
    await sql`INSERT INTO agents (id, tenant_id, name, created_at, updated_at)
      VALUES (${`agt_${tenant}`}, ${tenant}, 'a', ${now}, ${now})`.execute(db.q)
    await sql`INSERT INTO revisions (id, agent_id, tenant_id, status, content_hash, manifest_json, file_count, size_bytes, created_at)
      VALUES (${`rev_${tenant}`}, ${`agt_${tenant}`}, ${tenant}, 'READY', 'h', '{}', 0, 0, ${now})`.execute(
      db.q,
    )
  }
})

afterAll(async () => {
  await db?.close()
  await rm(dir, { recursive: true, force: true })
})

/** A few multi-byte characters, so bytes and characters differ. */
const text = (n: number) => 'aé€😀'.repeat(n)

type Op =
  | { kind: 'turn'; s: number; prompt: number }
  | { kind: 'respond'; s: number; response: number }
  | { kind: 'events'; s: number; sizes: number[] }
  | { kind: 'retention'; s: number }
  | { kind: 'forget'; s: number }
  | { kind: 'artifact'; s: number; bytes: number }
  | { kind: 'unartifact'; s: number }
  | { kind: 'command'; s: number; max: number }
  | { kind: 'progress'; s: number; bytes: number; kept: number; end: boolean }
  | { kind: 'deleteSession'; s: number }

const sessionCount = TENANTS.length * SESSIONS_PER_TENANT
const s = fc.integer({ min: 0, max: sessionCount - 1 })
const op: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ kind: fc.constant('turn' as const), s, prompt: fc.integer({ min: 0, max: 40 }) }),
  fc.record({ kind: fc.constant('respond' as const), s, response: fc.integer({ min: 0, max: 60 }) }),
  fc.record({
    kind: fc.constant('events' as const),
    s,
    sizes: fc.array(fc.integer({ min: 0, max: 30 }), { minLength: 1, maxLength: 6 }),
  }),
  fc.record({ kind: fc.constant('retention' as const), s }),
  fc.record({ kind: fc.constant('forget' as const), s }),
  fc.record({ kind: fc.constant('artifact' as const), s, bytes: fc.integer({ min: 0, max: 1e9 }) }),
  fc.record({ kind: fc.constant('unartifact' as const), s }),
  fc.record({ kind: fc.constant('command' as const), s, max: fc.integer({ min: 1, max: 1e6 }) }),
  fc.record({
    kind: fc.constant('progress' as const),
    s,
    bytes: fc.integer({ min: 0, max: 1e6 }),
    kept: fc.integer({ min: 0, max: 1e6 }),
    end: fc.boolean(),
  }),
  fc.record({ kind: fc.constant('deleteSession' as const), s }),
)

interface ModelCommand {
  id: string
  startedAt: string
  status: 'running' | 'exited'
  max: number
  output: number
  keptFrom: number
}

interface ModelSession {
  id: string
  tenant: string
  deleted: boolean
  /** Turn id, its text bytes, its events' bytes, next event seq. */
  turns: { id: string; textBytes: number; eventBytes: number; seq: number; response: string }[]
  artifacts: { id: string; bytes: number }[]
  commands: ModelCommand[]
}

const bytes = (value: string) => Buffer.byteLength(value)
let serial = 0
const nextId = (prefix: string) => `${prefix}_${String(++serial).padStart(8, '0')}`

/** The model's bytes of a tenant, by column. */
function modelOf(sessions: ModelSession[], tenant: string) {
  const mine = sessions.filter((m) => m.tenant === tenant)
  const sum = (values: number[]) => values.reduce((a, b) => a + b, 0)
  return {
    artifact_bytes: sum(mine.flatMap((m) => m.artifacts.map((a) => a.bytes))),
    command_log_bytes: sum(mine.map(commandLogBytes)),
    turn_event_bytes: sum(mine.flatMap((m) => m.turns.map((t) => t.eventBytes))),
    turn_text_bytes: sum(mine.flatMap((m) => m.turns.map((t) => t.textBytes))),
  }
}

/** Running commands at their bound, the last KEPT_ENDED_COMMANDS ended at what they kept. */
function commandLogBytes(m: ModelSession): number {
  if (m.deleted) return 0
  const newest = [...m.commands].sort((a, b) =>
    a.startedAt === b.startedAt ? b.id.localeCompare(a.id) : b.startedAt.localeCompare(a.startedAt),
  )
  const running = newest.filter((c) => c.status === 'running').reduce((n, c) => n + c.max, 0)
  const ended = newest
    .filter((c) => c.status !== 'running')
    .slice(0, KEPT_ENDED_COMMANDS)
    .reduce((n, c) => n + c.output - c.keptFrom, 0)
  return running + ended
}

async function counters(tenant: string) {
  const row = await db.q
    .selectFrom('tenant_storage')
    .select(['artifact_bytes', 'command_log_bytes', 'turn_event_bytes', 'turn_text_bytes'])
    .where('tenant_id', '=', tenant)
    .executeTakeFirst()
  return {
    artifact_bytes: Number(row?.artifact_bytes ?? 0),
    command_log_bytes: Number(row?.command_log_bytes ?? 0),
    turn_event_bytes: Number(row?.turn_event_bytes ?? 0),
    turn_text_bytes: Number(row?.turn_text_bytes ?? 0),
  }
}

/** Every stored turn event of the tenant, summed (what the budget read before the counters). */
async function scannedEventBytes(tenant: string): Promise<number> {
  const size = db.dialect === 'postgres' ? sql`octet_length(e.event)` : sql`length(CAST(e.event AS BLOB))`
  const result = await sql<{ bytes: number | string | null }>`
    SELECT SUM(${size}) AS bytes
    FROM turn_events e JOIN turns t ON t.id = e.turn_id JOIN sessions s ON s.id = t.session_id
    WHERE s.tenant_id = ${tenant}`.execute(db.q)
  return Number(result.rows[0]?.bytes ?? 0)
}

async function newSession(tenant: string): Promise<ModelSession> {
  const id = nextId('ses')
  await sql`INSERT INTO sessions (id, tenant_id, agent_id, revision_id, status, status_cause, idle_timeout_ms, keep_warm_ms, created_at, updated_at, last_active_at)
    VALUES (${id}, ${tenant}, ${`agt_${tenant}`}, ${`rev_${tenant}`}, 'idle', 'created', 1000, 1000, ${now}, ${now}, ${now})`.execute(
    db.q,
  )
  return { id, tenant, deleted: false, turns: [], artifacts: [], commands: [] }
}

/** Applies `o` to the model at once and returns the database's side of it. */
function apply(m: ModelSession, o: Op): () => Promise<unknown> {
  const records = new TurnRecords(db)
  const commands = new CommandStore(db)
  const turn = m.turns.at(-1)
  switch (o.kind) {
    case 'turn': {
      const prompt = text(o.prompt)
      const id = nextId('turn')
      m.turns.push({ id, textBytes: bytes(prompt), eventBytes: 0, seq: 1, response: '' })
      const seq = m.turns.length + serial
      return () =>
        sql`INSERT INTO turns (id, session_id, seq, status, prompt, started_at)
          VALUES (${id}, ${m.id}, ${seq}, 'completed', ${prompt}, ${now})`.execute(db.q)
    }
    case 'respond': {
      if (!turn) return async () => undefined
      const response = text(o.response)
      turn.textBytes += bytes(response) - bytes(turn.response)
      turn.response = response
      return () => db.q.updateTable('turns').set({ response }).where('id', '=', turn.id).execute()
    }
    case 'events': {
      if (!turn) return async () => undefined
      const rows = o.sizes.map((size) => ({
        id: turn.seq++,
        event: { type: 'message.delta' as const, turnId: turn.id, content: text(size) },
      }))
      turn.eventBytes += rows.reduce((n, r) => n + bytes(JSON.stringify(r.event)), 0)
      return () => db.transaction(() => insertEvents(db, turn.id, rows))
    }
    case 'retention':
      for (const t of m.turns) t.eventBytes = 0
      return () => records.deleteTurnEvents(m.id)
    case 'forget':
      m.turns = []
      return () => records.deleteTranscript(m.id)
    case 'artifact': {
      const id = nextId('artifact')
      m.artifacts.push({ id, bytes: o.bytes })
      return () =>
        db.q
          .insertInto('artifacts')
          .values({
            id,
            tenant_id: m.tenant,
            agent_id: `agt_${m.tenant}`,
            session_id: m.id,
            path: 'f',
            size_bytes: o.bytes,
            sha256: 'x',
            created_at: now,
          })
          .execute()
    }
    case 'unartifact': {
      const gone = m.artifacts.shift()
      if (!gone) return async () => undefined
      return () => db.q.deleteFrom('artifacts').where('id', '=', gone.id).execute()
    }
    case 'command': {
      const id = nextId('cmd')
      const startedAt = new Date(Date.parse(now) + serial * 1000).toISOString()
      m.commands.push({ id, startedAt, status: 'running', max: o.max, output: 0, keptFrom: 0 })
      return () =>
        commands.insert({
          id,
          session_id: m.id,
          tenant_id: m.tenant,
          command_json: '["true"]',
          cwd: '/workspace',
          status: 'running',
          exit_code: null,
          signal: null,
          end_cause: null,
          output_bytes: 0,
          kept_from_offset: 0,
          stdin_open: 0,
          timeout_ms: 1000,
          max_output_bytes: o.max,
          started_at: startedAt,
          ended_at: null,
        })
    }
    case 'progress': {
      const command = m.commands.find((c) => c.status === 'running')
      if (!command) return async () => undefined
      const output = o.bytes
      const keptFrom = Math.min(o.kept, output)
      command.output = output
      command.keptFrom = keptFrom
      const state: CommandState = {
        commandId: command.id,
        sessionId: m.id,
        status: 'running',
        exitCode: null,
        signal: null,
        endCause: null,
        outputBytes: output,
        keptFromOffset: keptFrom,
        stdinOpen: false,
      }
      if (!o.end) return () => commands.progress(command.id, state)
      command.status = 'exited'
      return () =>
        commands.end(command.id, {
          status: 'exited',
          exit_code: 0,
          signal: null,
          end_cause: 'exited',
          ended_at: now,
          output_bytes: output,
          kept_from_offset: keptFrom,
        })
    }
    case 'deleteSession':
      m.deleted = true
      return () => db.q.updateTable('sessions').set({ status: 'deleted' }).where('id', '=', m.id).execute()
  }
}

/** Ops that make the model depend on their order against others on the same session. */
const ORDERED = new Set<Op['kind']>(['turn', 'retention', 'forget', 'deleteSession', 'unartifact', 'respond'])

/** Whether `a` and `b` may not run at once (the model could not tell their outcome). */
function clashes(a: Op, b: Op): boolean {
  if (a.s !== b.s) return false
  if (ORDERED.has(a.kind) || ORDERED.has(b.kind)) return true
  // A progress names a command started before it: not one started in its group.
  const kinds = new Set([a.kind, b.kind])
  return kinds.has('progress') && (kinds.has('command') || kinds.size === 1)
}

/** Splits `ops` into groups run concurrently: an ordered op is alone on its session in its group. */
function groups(ops: Op[], size: number): Op[][] {
  const out: Op[][] = []
  let group: Op[] = []
  for (const o of ops) {
    const clash = group.some((g) => clashes(g, o))
    if (group.length >= size || clash) {
      out.push(group)
      group = []
    }
    group.push(o)
  }
  if (group.length > 0) out.push(group)
  return out
}

describe('tenant storage counters', () => {
  it('stay equal to the model and to a full scan under concurrent writes, deletes and retention', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 40 }), async (ops) => {
        // Each run: fresh sessions; the counters start from what earlier runs left.
        const before = Object.fromEntries(await Promise.all(TENANTS.map(async (t) => [t, await counters(t)])))
        const sessions: ModelSession[] = []
        for (const tenant of TENANTS)
          for (let i = 0; i < SESSIONS_PER_TENANT; i++) sessions.push(await newSession(tenant))
        for (const group of groups(ops, 4)) {
          const runs = group.map((o) => apply(sessions[o.s] as ModelSession, o))
          await Promise.all(runs.map((run) => run()))
        }
        for (const tenant of TENANTS) {
          const was = before[tenant] as Awaited<ReturnType<typeof counters>>
          const model = modelOf(sessions, tenant)
          const now = await counters(tenant)
          expect({
            artifact_bytes: now.artifact_bytes - was.artifact_bytes,
            command_log_bytes: now.command_log_bytes - was.command_log_bytes,
            turn_event_bytes: now.turn_event_bytes - was.turn_event_bytes,
            turn_text_bytes: now.turn_text_bytes - was.turn_text_bytes,
          }).toEqual(model)
          expect(now.turn_event_bytes).toBe(await scannedEventBytes(tenant))
        }
      }),
      { numRuns: 60 },
    )
  }, 120_000)

  it("stay exact when many commands of one session start and end at once (each recounts the session's window)", async () => {
    const tenant = TENANTS[0]
    const was = await counters(tenant)
    const session = await newSession(tenant)
    const started = Array.from({ length: 40 }, (_, i) => ({ kind: 'command' as const, s: 0, max: 1000 + i }))
    await Promise.all(started.map((o) => apply(session, o)()))
    const ends = session.commands.map(() => ({
      kind: 'progress' as const,
      s: 0,
      bytes: 700,
      kept: 0,
      end: true,
    }))
    const runs = ends.map((o) => apply(session, o))
    await Promise.all(runs.map((run) => run()))
    expect((await counters(tenant)).command_log_bytes - was.command_log_bytes).toBe(commandLogBytes(session))
  })
})
