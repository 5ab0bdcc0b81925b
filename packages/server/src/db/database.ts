import { AsyncLocalStorage } from 'node:async_hooks'
import { CairnProblem } from '@cairn/protocol'
import BetterSqlite3 from 'better-sqlite3'
import { type Compilable, Kysely, PostgresDialect, SqliteDialect, type Transaction } from 'kysely'
import type pg from 'pg'
import { type Dialect, forDialect, MIGRATIONS } from './migrations/index.js'
import { PostgresTextPlugin, postgresText } from './postgres-text.js'
import { type ArgsOf, QueryShapes } from './query-shapes.js'
import type { Schema } from './schema.js'

/**
 * The control plane's database: SQLite (one machine) or PostgreSQL (replicas), one query layer.
 * Stores run their queries on `q`: inside `transaction(fn)` that is the transaction (carried by
 * the async context, so stores called from `fn` join it without being handed it), else the database.
 */
export class Db {
  /** Hears every statement sent to the database (benches and tests count a turn's). */
  readonly statements: StatementTap
  private readonly current = new AsyncLocalStorage<{
    trx: Transaction<Schema>
    afterCommit: (() => void)[]
  }>()

  /** The warm turn's statements, compiled once per shape (query-shapes.ts). */
  private readonly shapes: QueryShapes

  constructor(
    readonly kysely: Kysely<Schema>,
    readonly dialect: Dialect,
    statements?: StatementTap,
  ) {
    this.statements = statements ?? new StatementTap()
    this.shapes = new QueryShapes(dialect === 'postgres' ? postgresText : undefined)
  }

  /**
   * Runs the statement `build` makes of `args` where `q` would, compiled once per `key` (see
   * `QueryShapes`): for the statements every warm turn sends. Its rows, and the rows it changed.
   */
  async shaped<R, A extends ArgsOf<A>>(
    key: string,
    args: A,
    build: (q: Kysely<Schema>, args: A) => Compilable<R>,
  ): Promise<{ rows: R[]; changed: bigint }> {
    const result = await this.q.executeQuery(this.shapes.compiled(key, args, (a) => build(this.kysely, a)))
    return { rows: result.rows, changed: result.numAffectedRows ?? 0n }
  }

  /** Where a query runs now: the enclosing transaction, or the database. */
  get q(): Kysely<Schema> {
    return this.current.getStore()?.trx ?? this.kysely
  }

  /**
   * Runs `fn` in one transaction (all or nothing); inside one already, `fn` joins it. Only the
   * database is awaited inside: on SQLite every other query waits for the transaction to end.
   */
  async transaction<T>(fn: () => Promise<T>): Promise<T> {
    if (this.current.getStore()) return fn()
    const afterCommit: (() => void)[] = []
    const result = await this.kysely
      .transaction()
      .execute((trx) => this.current.run({ trx, afterCommit }, fn))
    for (const callback of afterCommit) callback()
    return result
  }

  /** Runs `callback` once the enclosing transaction committed (at once outside of one). */
  afterCommit(callback: () => void): void {
    const store = this.current.getStore()
    if (store) store.afterCommit.push(callback)
    else callback()
  }

  async close(): Promise<void> {
    await this.kysely.destroy()
  }
}

/**
 * Every statement the database is sent, as its text (`begin` and `commit` included), told to
 * whoever listens at the moment; with no one listening it costs a check per statement.
 */
export class StatementTap {
  private readonly listeners = new Set<(sql: string) => void>()

  /** `listener` hears each statement sent from now on, until the returned function is called. */
  listen(listener: (sql: string) => void): () => void {
    this.listeners.add(listener)
    return () => {
      this.listeners.delete(listener)
    }
  }

  /** Called by the connection as it sends `sql`. */
  sent(sql: string): void {
    if (this.listeners.size === 0) return
    for (const listener of this.listeners) listener(sql)
  }
}

/** A `postgres://` (or `postgresql://`) URL names PostgreSQL; anything else is a SQLite file. */
export function isPostgresUrl(target: string): boolean {
  return /^postgres(ql)?:\/\//.test(target)
}

/** A unique constraint refused the row (SQLite and PostgreSQL spell it differently). */
export function isUniqueViolation(error: unknown): boolean {
  const code = (error as { code?: unknown } | undefined)?.code
  return code === 'SQLITE_CONSTRAINT_UNIQUE' || code === '23505'
}

const STATEMENT_CACHE_SIZE = 500

/**
 * Opens the database and applies pending migrations (a node, `migrate: false`, only checks them), each in its own transaction; versions
 * already recorded in `schema_migrations` (by this code or an older one) are never applied again.
 */
export async function openDatabase(target: string, options: OpenDatabaseOptions = {}): Promise<Db> {
  return isPostgresUrl(target) ? openPostgres(target, options) : openSqlite(target)
}

export interface OpenDatabaseOptions {
  /**
   * PostgreSQL: how long a statement may go unanswered before it fails as the database being
   * unavailable (default `POSTGRES_QUERY_TIMEOUT_MS`; 0: unbounded, for bulk copies).
   */
  queryTimeoutMs?: number | undefined
  /**
   * PostgreSQL: false for a node, which may not change the schema (its role has no such right):
   * it checks that every migration it knows was applied (by an API replica) and refuses to open
   * otherwise. Default true.
   */
  migrate?: boolean | undefined
}

function openSqlite(file: string): Db {
  const raw = new BetterSqlite3(file)
  raw.pragma('journal_mode = WAL')
  raw.pragma('synchronous = NORMAL')
  raw.pragma('foreign_keys = ON')
  raw.pragma('busy_timeout = 5000')
  raw.exec(
    'CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)',
  )
  const applied = new Set(
    (raw.prepare('SELECT version FROM schema_migrations').all() as { version: number }[]).map(
      (r) => r.version,
    ),
  )
  for (const migration of MIGRATIONS) {
    if (applied.has(migration.version)) continue
    raw.transaction(() => {
      raw.exec(forDialect(migration.sql, 'sqlite'))
      if (migration.dialectSql) raw.exec(migration.dialectSql('sqlite'))
      raw
        .prepare('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)')
        .run(migration.version, migration.name, new Date().toISOString())
    })()
  }
  // Kysely prepares each query it runs; the warm path repeats the same few, so statements are
  // kept (better-sqlite3 statements are reusable) instead of compiled again on every turn.
  const statements = new Map<string, BetterSqlite3.Statement>()
  const tap = new StatementTap()
  const kysely = new Kysely<Schema>({
    dialect: new SqliteDialect({
      database: {
        close: () => raw.close(),
        prepare: (sql: string) => {
          tap.sent(sql)
          let statement = statements.get(sql)
          if (!statement) {
            if (statements.size >= STATEMENT_CACHE_SIZE) statements.clear()
            statement = raw.prepare(sql)
            statements.set(sql, statement)
          }
          return statement
        },
      },
    }),
  })
  return new Db(kysely, 'sqlite', tap)
}

const INT8_OID = 20

/**
 * PostgreSQL's side of a connection notices a client that went away without a word within about
 * 10 s (5 s idle, then five probes a second apart; at once when the link is back, whose first
 * probe is answered with a reset). The pool resets a connection whose statement went unanswered
 * (postgres-pool.ts `abandonConnection`), and a reset sent into a cut link never arrives: without
 * these the backend, and any lock its open transaction holds, would wait for the operating
 * system's two hours.
 */
const DEAD_PEER_SETTINGS =
  'SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = 5'

async function openPostgres(url: string, options: OpenDatabaseOptions): Promise<Db> {
  // pg and the pool around it are loaded for PostgreSQL only: a server on SQLite (and each test
  // file of the SQLite pass) does not pay for them at start.
  const [{ default: pg }, { BoundedConnectClient, boundedPool, POSTGRES_QUERY_TIMEOUT_MS }] =
    await Promise.all([import('pg'), import('./postgres-pool.js')])
  // COUNT(*) and BIGINT columns come back as numbers (they stay far below 2^53).
  const types = {
    getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
      oid === INT8_OID
        ? (value: string) => Number(value)
        : pg.types.getTypeParser(oid, format as 'text')) as typeof pg.types.getTypeParser,
  }
  // Opening a connection is bounded (see postgres-pool.ts), waiting for a free one of the pool's
  // is not: under load requests queue for the ten connections (a bound there answered 503 to a
  // busy but healthy database), and in an outage each one they wait for frees within a statement's
  // bound. The migrations below (which may wait for another replica's) run unbounded on the raw pool.
  const pool = new pg.Pool({
    connectionString: url,
    max: 10,
    types,
    keepAlive: true,
    Client: BoundedConnectClient,
  })
  // A connection the server drops while idle (a restart, pg_terminate_backend) is an error
  // event on the pool; the next query opens a new one.
  pool.on('error', () => {})
  // One dropped while checked out but between statements (inside a transaction, say) is an error
  // event on the client itself, which would otherwise end the process; the statement that uses it
  // next fails and is answered as the database being unavailable.
  pool.on('connect', (connection) => {
    connection.on('error', () => {})
    // Queued ahead of the statement the connection was opened for; a failure shows there.
    connection.query(DEAD_PEER_SETTINGS).catch(() => {})
  })
  const client = await pool.connect()
  try {
    if (options.migrate === false) await checkMigrated(client)
    else await migratePostgres(client)
  } catch (error) {
    client.release()
    await pool.end()
    throw error
  }
  client.release()
  const tap = new StatementTap()
  return new Db(
    new Kysely<Schema>({
      dialect: new PostgresDialect({
        pool: boundedPool(
          pool,
          { connectionString: url, types },
          options.queryTimeoutMs ?? POSTGRES_QUERY_TIMEOUT_MS,
          tap,
        ),
      }),
      plugins: [new PostgresTextPlugin()],
    }),
    'postgres',
    tap,
  )
}

/** Applies every migration not applied yet, one replica at a time. */
async function migratePostgres(client: pg.PoolClient): Promise<void> {
  try {
    await client.query('BEGIN')
    // Replicas starting together migrate one at a time.
    await client.query('SELECT pg_advisory_xact_lock(7302117)')
    await client.query(
      'CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)',
    )
    const applied = new Set(
      (await client.query<{ version: number }>('SELECT version FROM schema_migrations')).rows.map((r) =>
        Number(r.version),
      ),
    )
    for (const migration of MIGRATIONS) {
      if (applied.has(migration.version)) continue
      await client.query(forDialect(migration.sql, 'postgres'))
      if (migration.dialectSql) await client.query(migration.dialectSql('postgres'))
      await client.query('INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)', [
        migration.version,
        migration.name,
        new Date().toISOString(),
      ])
    }
    await client.query('COMMIT')
  } catch (error) {
    await client.query('ROLLBACK').catch(() => {})
    throw error
  }
}

/** A node's open: the schema must be this version's already (an API replica migrates it). */
async function checkMigrated(client: pg.PoolClient): Promise<void> {
  const rows = await client
    .query<{ version: number }>('SELECT version FROM schema_migrations')
    .then((result) => result.rows)
    .catch((error: unknown) => {
      throw new CairnProblem(
        'unavailable',
        `the cluster database's schema could not be read (${error instanceof Error ? error.message : String(error)}): start an API replica first (it applies the migrations), and give the node a role in cairn_node (docs/cluster.md)`,
      )
    })
  const applied = new Set(rows.map((r) => Number(r.version)))
  const missing = MIGRATIONS.filter((m) => !applied.has(m.version)).map((m) => m.version)
  if (missing.length > 0)
    throw new CairnProblem(
      'unavailable',
      `the cluster database lacks migrations ${missing.join(', ')}: start (or upgrade) an API replica first; it applies them, a node may not`,
      { missing },
    )
}
