import type { Socket } from 'node:net'
import type { PostgresPool, PostgresPoolClient, PostgresQueryResult } from 'kysely'
import pg from 'pg'

/**
 * How long a request waits for PostgreSQL before it is answered `503 unavailable`: to open a
 * connection, and for a statement's answer while the database answers nothing else either (see
 * AnswerWatch). A database that stopped answering (a paused or partitioned server, a failover in
 * progress) costs a request about this long, not the whole outage.
 */
export const POSTGRES_CONNECT_TIMEOUT_MS = 2000
export const POSTGRES_QUERY_TIMEOUT_MS = 2000

/**
 * A connection whose opening is bounded by `POSTGRES_CONNECT_TIMEOUT_MS` (a server that accepts
 * but never answers the start-up fails it as "Connection terminated"). Given to the pool as its
 * client class, so that the bound holds for opening a connection and not for waiting in the
 * pool's queue, which pg's own `connectionTimeoutMillis` would bound as well.
 */
export class BoundedConnectClient extends pg.Client {
  constructor(config?: string | pg.ClientConfig) {
    super({
      ...(typeof config === 'string' ? { connectionString: config } : config),
      connectionTimeoutMillis: POSTGRES_CONNECT_TIMEOUT_MS,
    })
  }
}

/**
 * Watches the statements of one pool: the database counts as not answering when a statement has
 * waited `timeoutMs`, no statement of the pool got any answer (a result or an error) for as long,
 * and a probe (`SELECT 1` on a connection of its own, bounded by the same time) goes unanswered
 * too. A slow statement of a busy database (a lock wait on another process's transaction, a large
 * read, a queue of 200 turns, an event loop behind on its timers) is never failed while the
 * database answers; a paused or cut-off server fails every waiting statement within about twice
 * `timeoutMs`. The decision is taken after the event loop has read what the sockets hold
 * (setImmediate), so a late timer does not fail a statement whose answer was already there.
 */
class AnswerWatch {
  private lastAnswerAt = performance.now()
  private readonly waiting = new Set<Waiting>()
  private timer: NodeJS.Timeout | undefined
  private probing = false

  constructor(
    private readonly timeoutMs: number,
    private readonly probe: () => Promise<void>,
  ) {}

  /** Runs `statement`, failing it (and calling `onNoAnswer`) when the database stopped answering. */
  run<T>(
    statement: Promise<T>,
    parameters: ReadonlyArray<unknown>,
    onNoAnswer: (error: Error) => void,
  ): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const waiting: Waiting = {
        startedAt: performance.now(),
        timeoutMs: timeoutFor(parameters, this.timeoutMs),
        fail: (error) => {
          this.waiting.delete(waiting)
          onNoAnswer(error)
          reject(error)
        },
      }
      this.waiting.add(waiting)
      this.arm()
      statement.then(
        (value) => this.settled(waiting, () => resolve(value)),
        (error: unknown) => this.settled(waiting, () => reject(error)),
      )
    })
  }

  private settled(waiting: Waiting, settle: () => void): void {
    this.lastAnswerAt = performance.now()
    if (this.waiting.delete(waiting)) settle()
  }

  private arm(): void {
    if (this.timer) return
    this.timer = setInterval(() => setImmediate(() => this.check()), Math.max(50, this.timeoutMs / 8))
    this.timer.unref()
  }

  private check(): void {
    if (this.overdue().length > 0 && !this.probing) {
      this.probing = true
      this.probe().then(
        () => {
          this.probing = false
          this.lastAnswerAt = performance.now()
        },
        (error: unknown) => {
          this.probing = false
          const silentMs = Math.round(performance.now() - this.lastAnswerAt)
          const reason = (error as Error | undefined)?.message ?? String(error)
          const failure = new Error(
            `${READ_TIMEOUT}: no answer from PostgreSQL for ${silentMs} ms (${reason})`,
          )
          for (const waiting of this.overdue()) waiting.fail(failure)
        },
      )
    }
    if (this.waiting.size === 0 && !this.probing && this.timer) {
      clearInterval(this.timer)
      this.timer = undefined
    }
  }

  /** The statements that waited their time while the database answered nothing for as long. */
  private overdue(): Waiting[] {
    const now = performance.now()
    const silentMs = now - this.lastAnswerAt
    return [...this.waiting].filter(
      (waiting) => silentMs >= waiting.timeoutMs && now - waiting.startedAt >= waiting.timeoutMs,
    )
  }
}

interface Waiting {
  startedAt: number
  timeoutMs: number
  fail(error: Error): void
}

/** More time for a statement carrying a large value (an artifact's bytes), per MiB it carries. */
const QUERY_TIMEOUT_PER_MIB_MS = 1000

/** pg's error for a statement that got no answer within its timeout. */
const READ_TIMEOUT = 'Query read timeout'

/**
 * The pool as Kysely uses it, every statement bounded by `queryTimeoutMs` (0: unbounded). A
 * connection whose statement timed out is in an unknown state (the statement may still run): it
 * refuses what follows at once (a transaction's rollback) and is closed when released, never
 * handed to another request.
 */
export function boundedPool(
  pool: pg.Pool,
  config: pg.ClientConfig,
  queryTimeoutMs: number,
  tap?: { sent(sql: string): void },
): PostgresPool {
  const watch =
    queryTimeoutMs > 0 ? new AnswerWatch(queryTimeoutMs, () => probe(config, queryTimeoutMs)) : undefined
  return {
    connect: async () => boundedClient(await pool.connect(), watch, tap),
    end: () => pool.end(),
  }
}

function boundedClient(
  client: pg.PoolClient,
  watch: AnswerWatch | undefined,
  tap: { sent(sql: string): void } | undefined,
): PostgresPoolClient {
  let timedOut: Error | undefined
  const query = async <R>(sql: string, parameters: ReadonlyArray<unknown>) => {
    if (timedOut) throw timedOut
    tap?.sent(sql)
    const statement = client.query({ text: sql, values: [...parameters] })
    if (!watch) return (await statement) as unknown as PostgresQueryResult<R>
    // An abandoned statement's own answer (or its connection's end) is no one's any more.
    statement.catch(() => {})
    const result = await watch.run(statement, parameters, (error) => {
      timedOut = error
      abandonConnection(client)
    })
    return result as unknown as PostgresQueryResult<R>
  }
  return {
    query: query as PostgresPoolClient['query'],
    release: (destroy?: boolean) => client.release(destroy === true || timedOut !== undefined),
  }
}

/**
 * Drops the connection of a statement nobody waits for any more with a reset, not a close: a
 * closed socket's kernel goes on sending what it still holds, so a statement written into a cut
 * link (a partition, a frozen server) would reach PostgreSQL and run once the link heals, seconds
 * or minutes after its request was answered `unavailable` (a node's abandoned registrations did:
 * each one, delivered after the heal, was a new incarnation). A reset discards the unsent bytes;
 * what PostgreSQL already received may still run, as with any lost answer.
 */
function abandonConnection(client: pg.PoolClient): void {
  const stream = (client as unknown as { connection?: { stream?: Socket } }).connection?.stream
  if (!stream || stream.destroyed) return
  try {
    stream.resetAndDestroy()
  } catch {
    stream.destroy()
  }
}

/** Whether PostgreSQL answers `SELECT 1` on a new connection within `timeoutMs` (else throws). */
async function probe(config: pg.ClientConfig, timeoutMs: number): Promise<void> {
  const client = new BoundedConnectClient({ ...config, query_timeout: timeoutMs })
  client.on('error', () => {})
  try {
    await client.connect()
    await client.query('SELECT 1')
  } finally {
    client.end().catch(() => {})
  }
}

function timeoutFor(parameters: ReadonlyArray<unknown>, baseMs: number): number {
  let bytes = 0
  for (const value of parameters) {
    if (Buffer.isBuffer(value) || value instanceof Uint8Array) bytes += value.byteLength
    else if (typeof value === 'string') bytes += value.length
  }
  return baseMs + Math.floor(bytes / (1024 * 1024)) * QUERY_TIMEOUT_PER_MIB_MS
}
