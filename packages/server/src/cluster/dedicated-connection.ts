import type pg from 'pg'

const INT8_OID = 20

let pgModule: typeof pg | undefined

/**
 * pg, loaded by the first connection rather than with the module: a server on SQLite imports this
 * module and never connects. Once loaded, `open` takes it without waiting.
 */
async function loadPg(): Promise<typeof pg> {
  pgModule ??= (await import('pg')).default
  return pgModule
}

/** BIGINT columns (epochs, counts) come back as numbers, as the pool's do. */
function int8AsNumber(types: typeof pg.types) {
  return {
    getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
      oid === INT8_OID
        ? (value: string) => Number(value)
        : types.getTypeParser(oid, format as 'text')) as typeof pg.types.getTypeParser,
  }
}

export interface DedicatedConnectionOptions {
  /** How long connecting may take before it counts as failed. */
  connectTimeoutMs: number
  /** How long one statement may take before it counts as failed (a partition hangs, never errors). */
  queryTimeoutMs: number
  /** What the connection is for, as `pg_stat_activity.application_name` shows it. */
  applicationName?: string
}

/**
 * One PostgreSQL connection of its own, outside the pool: what holds a session-level advisory lock
 * (a node's liveness lock, the leader's lock) or LISTENs. Its loss is the lock's loss, so it is
 * reported (`lost`) and never silently replaced: the owner decides when to connect again.
 */
export class DedicatedConnection {
  private client: pg.Client | undefined
  private lostListeners: (() => void)[] = []

  constructor(
    private readonly url: string,
    private readonly options: DedicatedConnectionOptions,
  ) {}

  get connected(): boolean {
    return this.client !== undefined
  }

  /** `listener` is called once each time the open connection ends or fails. */
  onLost(listener: () => void): void {
    this.lostListeners.push(listener)
  }

  /** The open connection, or a new one. */
  async open(): Promise<pg.Client> {
    if (this.client) return this.client
    const pg = pgModule ?? (await loadPg())
    const client = new pg.Client({
      connectionString: this.url,
      types: int8AsNumber(pg.types),
      connectionTimeoutMillis: this.options.connectTimeoutMs,
      query_timeout: this.options.queryTimeoutMs,
      keepAlive: true,
      keepAliveInitialDelayMillis: 1000,
      ...(this.options.applicationName ? { application_name: this.options.applicationName } : {}),
    })
    let ended = false
    const lost = () => {
      if (ended) return
      ended = true
      if (this.client === client) this.client = undefined
      client.end().catch(() => {})
      for (const listener of this.lostListeners) listener()
    }
    // A dropped connection is an error event; without a listener it would end the process.
    client.on('error', lost)
    client.on('end', lost)
    try {
      await client.connect()
    } catch (error) {
      ended = true
      await client.end().catch(() => {})
      throw error
    }
    this.client = client
    return client
  }

  async query<R>(text: string, values: readonly unknown[] = []): Promise<R[]> {
    const client = await this.open()
    try {
      return (await client.query(text, values as unknown[])).rows as R[]
    } catch (error) {
      // A statement that timed out leaves the connection in an unknown state: it is dropped
      // (and with it any lock it held, which the owner learns through `onLost`).
      if (error instanceof Error && /timeout/i.test(error.message)) this.drop()
      throw error
    }
  }

  /** Ends the connection (its session locks are released by the server). */
  drop(): void {
    const client = this.client
    if (!client) return
    client.emit('end')
  }

  async close(): Promise<void> {
    const client = this.client
    this.lostListeners = []
    this.client = undefined
    await client?.end().catch(() => {})
  }
}

/**
 * Advisory lock keys: the two-integer form, so the cluster's locks never meet another user's
 * single-bigint keys (the migration lock is one). `hashtext` of a node's ID is its lock.
 */
export const NODE_LOCK_CLASS = 0x636e6f64 // 'cnod'
export const LEADER_LOCK_CLASS = 0x636c6472 // 'cldr'
