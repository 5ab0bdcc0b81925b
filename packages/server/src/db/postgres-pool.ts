import type { PostgresPool, PostgresPoolClient, PostgresQueryResult } from 'kysely'
import type pg from 'pg'

/**
 * How long a request waits for PostgreSQL before it is answered `503 unavailable`: for a
 * connection (a new one, or a free one of the pool's) and for the answer to each statement. A
 * database that stopped answering (a paused or partitioned server, a failover in progress) costs
 * a request this long, not the whole outage.
 */
export const POSTGRES_CONNECT_TIMEOUT_MS = 2000
export const POSTGRES_QUERY_TIMEOUT_MS = 2000

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
export function boundedPool(pool: pg.Pool, queryTimeoutMs: number): PostgresPool {
  return {
    connect: async () => boundedClient(await pool.connect(), queryTimeoutMs),
    end: () => pool.end(),
  }
}

function boundedClient(client: pg.PoolClient, queryTimeoutMs: number): PostgresPoolClient {
  let timedOut: Error | undefined
  const query = async <R>(sql: string, parameters: ReadonlyArray<unknown>) => {
    if (timedOut) throw timedOut
    try {
      const result = await client.query({
        text: sql,
        values: [...parameters],
        ...(queryTimeoutMs > 0 ? { query_timeout: timeoutFor(parameters, queryTimeoutMs) } : {}),
      })
      return result as unknown as PostgresQueryResult<R>
    } catch (error) {
      if ((error as Error | undefined)?.message === READ_TIMEOUT) timedOut = error as Error
      throw error
    }
  }
  return {
    query: query as PostgresPoolClient['query'],
    release: (destroy?: boolean) => client.release(destroy === true || timedOut !== undefined),
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
