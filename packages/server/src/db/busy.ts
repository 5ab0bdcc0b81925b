/** SQLite refused because another connection holds the write lock past `busy_timeout`. */
export function isBusy(error: unknown): boolean {
  const code = (error as { code?: unknown } | undefined)?.code
  return typeof code === 'string' && /^SQLITE_(BUSY|LOCKED)/.test(code)
}

/**
 * Runs a write that must not be lost (the end of a turn whose reply was already streamed): while
 * another process holds the database's write lock, it tries again, yielding the event loop
 * between attempts, for up to `maxWaitMs`. Each attempt itself waits up to `busy_timeout`.
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
      if (!isBusy(error) || Date.now() - started > maxWaitMs) throw error
      await new Promise((resolve) => setTimeout(resolve, pauseMs))
    }
  }
}
