/** SQLite refused because another connection holds the write lock past `busy_timeout`. */
export function isBusy(error: unknown): boolean {
  const code = (error as { code?: unknown } | undefined)?.code
  return typeof code === 'string' && /^SQLITE_(BUSY|LOCKED)/.test(code)
}

/** PostgreSQL error classes that mean "not now", not "never": connection lost, server restarting. */
const POSTGRES_TRANSIENT = /^(08|57P0[123]|53300)/
const NODE_CONNECTION = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH'])

/** A statement sent but not answered in time: it may still take effect once the database answers. */
export const NO_ANSWER = 'the database did not answer in time'

/**
 * Why the database cannot answer now, when that is passing (a retry can succeed): SQLite's write
 * lock held by another process, or PostgreSQL unreachable, restarting or having dropped the
 * connection. Undefined for any other error.
 */
export function unavailableReason(error: unknown): string | undefined {
  if (isBusy(error)) return 'the database is locked by another writer'
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown }
  if (typeof code === 'string' && (POSTGRES_TRANSIENT.test(code) || NODE_CONNECTION.has(code)))
    return `the database is unreachable (${code})`
  if (typeof message === 'string' && /^Query read timeout/.test(message)) return `${NO_ANSWER} (${message})`
  if (
    typeof message === 'string' &&
    /^Connection terminated|^timeout expired|^timeout exceeded when trying to connect|is not queryable/.test(
      message,
    )
  )
    return `the database is unreachable (${message})`
  return undefined
}

/**
 * Runs a write that must not be lost (the end of a turn whose reply was already streamed): while
 * the database cannot answer for a passing reason (another process holds SQLite's write lock,
 * PostgreSQL restarts or dropped the connection), it tries again, yielding the event loop between
 * attempts, for up to `maxWaitMs`.
 */
export async function whenNotBusy<T>(
  write: () => Promise<T>,
  maxWaitMs = 120_000,
  pauseMs = 250,
): Promise<T> {
  const started = Date.now()
  for (;;) {
    try {
      return await write()
    } catch (error) {
      if (unavailableReason(error) === undefined || Date.now() - started > maxWaitMs) throw error
      await new Promise((resolve) => setTimeout(resolve, pauseMs))
    }
  }
}
