import { existsSync, statSync } from 'node:fs'
import { readdir, readFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { sql } from 'kysely'
import { type Db, isPostgresUrl, openDatabase } from './database.js'
import type { Schema } from './schema.js'

/**
 * Every table, parents before children; rows are read back in the order they were written
 * (SQLite's rowid), so tables ordered by insertion keep their order on PostgreSQL. The tenants'
 * storage counters (`tenant_storage`, `session_command_logs`) are not copied: the target's
 * triggers count the rows as they are copied.
 */
const TABLES: readonly (keyof Schema)[] = [
  'tenants',
  'api_keys',
  'agents',
  'revisions',
  'sessions',
  'commands',
  'turns',
  'turn_events',
  'session_events',
  'secrets',
  'snapshots',
  'retention_policies',
  'retention_events',
  'network_events',
  'agent_memory',
  'artifacts',
  'session_setups',
  'session_resume_runs',
  'preview_url_epochs',
  'shared_files',
  'build_logs',
  'artifact_blobs',
  'ag_ui_threads',
  'approvals',
  // After every table whose rows the outbox triggers watch: copied events write no outbox rows
  // (no endpoint exists yet); the outbox and deliveries are copied as they were.
  'webhook_endpoints',
  'webhook_outbox',
  'webhook_deliveries',
]

/**
 * Tables not copied, and why. Every other table of the source must be in `TABLES`: one that is in
 * neither refuses the move before anything is copied (a table added later and forgotten here was
 * left behind without a word: `commands` was).
 */
const NOT_COPIED: Readonly<Record<string, string>> = {
  schema_migrations: 'the target runs its own migrations',
  sqlite_sequence: "SQLite's own",
  storage_reservations: 'space held for work in flight, which a stopped server has none of',
  tenant_storage: "the target's triggers count the copied rows",
  session_command_logs: "the target's triggers count the copied rows",
  nodes: 'a cluster has none on SQLite',
  replicas: 'a cluster has none on SQLite',
  revision_nodes: 'a cluster has none on SQLite',
}

const BATCH_ROWS = 200

export interface MigrationReport {
  from: string
  to: string
  /** Rows copied, per table. */
  rows: Record<string, number>
}

/**
 * Moves a SQLite install's control plane (`cairn.db` of a data dir) into an empty PostgreSQL
 * database, in one transaction: every row of every table, and what the data dir holds that every
 * replica must reach (the secrets key, the egress CA, build logs, artifact bytes). The SQLite
 * database is brought to the current schema first (as a server start would) and otherwise left
 * as it was. A database that already holds a Cairn install is refused.
 */
export async function migrateToPostgres(from: string, to: string): Promise<MigrationReport> {
  if (!isPostgresUrl(to)) throw new CairnProblem('validation_failed', `--to must be a postgres:// URL`)
  const dataDir = existsSync(from) && statSync(from).isDirectory() ? from : path.dirname(from)
  const file = dataDir === from ? path.join(from, 'cairn.db') : from
  if (!existsSync(file)) throw new CairnProblem('not_found', `no SQLite database at ${file}`)
  const source = await openDatabase(file)
  try {
    await refuseUnknownTables(source)
    // A bulk copy: its statements are not bounded as a request's are.
    const target = await openDatabase(to, { queryTimeoutMs: 0 })
    try {
      const held = await target.kysely
        .selectFrom('tenants')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .executeTakeFirstOrThrow()
      if (Number(held.n) > 0)
        throw new CairnProblem(
          'conflict',
          'the PostgreSQL database already holds a Cairn install; migrate into an empty database',
        )
      const rows: Record<string, number> = {}
      await target.transaction(async () => {
        for (const table of TABLES) rows[table] = await copyTable(source, target, table)
        rows.shared_files = (rows.shared_files ?? 0) + (await copySharedFiles(dataDir, target))
        rows.build_logs = (rows.build_logs ?? 0) + (await copyBuildLogs(dataDir, target))
        rows.artifact_blobs = (rows.artifact_blobs ?? 0) + (await copyArtifactBytes(dataDir, source, target))
        // Identity columns: what comes next follows the copied values.
        await sql`SELECT setval(pg_get_serial_sequence('network_events', 'id'), COALESCE((SELECT MAX(id) FROM network_events), 0) + 1, false)`.execute(
          target.q,
        )
        await sql`SELECT setval(pg_get_serial_sequence('webhook_outbox', 'seq'), COALESCE((SELECT MAX(seq) FROM webhook_outbox), 0) + 1, false)`.execute(
          target.q,
        )
      })
      return { from: file, to: redactUrl(to), rows }
    } finally {
      await target.close()
    }
  } finally {
    await source.close()
  }
}

/** Every table of the source is copied or named in `NOT_COPIED`, else nothing is moved. */
async function refuseUnknownTables(source: Db): Promise<void> {
  const tables = await source.kysely
    .selectFrom('sqlite_master' as keyof Schema)
    .select(sql<string>`name`.as('name'))
    .where(sql`type`, '=', 'table')
    .execute()
  const known = new Set<string>([...TABLES, ...Object.keys(NOT_COPIED)])
  const unknown = tables.map((t) => t.name).filter((name) => !known.has(name))
  if (unknown.length > 0)
    throw new CairnProblem(
      'internal',
      `cairn migrate does not know how to move table(s) ${unknown.join(', ')}: nothing was copied`,
    )
}

async function copyTable(source: Db, target: Db, table: keyof Schema): Promise<number> {
  let copied = 0
  for (let offset = 0; ; offset += BATCH_ROWS) {
    const batch = (await source.kysely
      .selectFrom(table)
      .selectAll()
      .orderBy(sql`rowid`)
      .limit(BATCH_ROWS)
      .offset(offset)
      .execute()) as Record<string, unknown>[]
    if (batch.length === 0) return copied
    await target.q
      .insertInto(table)
      .values(batch as never) // one copy loop for every table: the rows are the table's own
      .execute()
    copied += batch.length
  }
}

/** The secrets key and the egress CA of the data dir, as `SharedFiles` stores them. */
async function copySharedFiles(dataDir: string, target: Db): Promise<number> {
  const groups: [string, string, string[]][] = [
    ['secret.key', dataDir, ['secret.key']],
    ['egress-ca', path.join(dataDir, 'egress-ca'), ['ca.key', 'ca.pem']],
  ]
  let stored = 0
  for (const [name, dir, files] of groups) {
    if (!files.every((f) => existsSync(path.join(dir, f)))) continue
    const content: Record<string, string> = {}
    for (const f of files) content[f] = (await readFile(path.join(dir, f))).toString('base64')
    const result = await target.q
      .insertInto('shared_files')
      .values({ name, content: Buffer.from(JSON.stringify(content)), created_at: new Date().toISOString() })
      .onConflict((oc) => oc.column('name').doNothing())
      .executeTakeFirst()
    stored += Number(result.numInsertedOrUpdatedRows ?? 0n)
  }
  return stored
}

/** Build logs kept as files (older installs) that the database does not hold yet. */
async function copyBuildLogs(dataDir: string, target: Db): Promise<number> {
  const dir = path.join(dataDir, 'build-logs')
  if (!existsSync(dir)) return 0
  let stored = 0
  for (const name of await readdir(dir)) {
    if (!name.endsWith('.log')) continue
    const result = await target.q
      .insertInto('build_logs')
      .values({
        revision_id: name.slice(0, -'.log'.length),
        log: await readFile(path.join(dir, name), 'utf8'),
      })
      .onConflict((oc) => oc.column('revision_id').doNothing())
      .executeTakeFirst()
    stored += Number(result.numInsertedOrUpdatedRows ?? 0n)
  }
  return stored
}

/** Each artifact's bytes, from `<data dir>/artifacts/<agent>/<id>`. */
async function copyArtifactBytes(dataDir: string, source: Db, target: Db): Promise<number> {
  let stored = 0
  for (const artifact of await source.kysely.selectFrom('artifacts').select(['id', 'agent_id']).execute()) {
    const file = path.join(dataDir, 'artifacts', artifact.agent_id, artifact.id)
    if (!existsSync(file)) continue
    const result = await target.q
      .insertInto('artifact_blobs')
      .values({ artifact_id: artifact.id, content: await readFile(file) })
      .onConflict((oc) => oc.column('artifact_id').doNothing())
      .executeTakeFirst()
    stored += Number(result.numInsertedOrUpdatedRows ?? 0n)
  }
  return stored
}

function redactUrl(url: string): string {
  return url.replace(/:[^:@/]*@/, ':***@')
}
