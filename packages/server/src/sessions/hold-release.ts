import type { Logger } from 'pino'

/** How often a release the database did not take is tried again. */
export const HOLD_RELEASE_RETRY_MS = 1000

/**
 * Releases a session hold (`release`, idempotent: it clears the hold only while `token` holds
 * it). One the database did not take (an outage: PostgreSQL restarting, unreachable) is tried
 * again every `retryMs` until it is taken or `untilMs` (the hold's own end) has passed, in the
 * background: left alone, the hold kept the session `409 session_busy` for the rest of its
 * 60 s after PostgreSQL was back (the cluster model test's soak, a snapshot in flight when
 * PostgreSQL restarted). Resolves once the first try is done.
 */
export async function releaseHold(
  release: () => Promise<void>,
  what: { session: string; operation: string },
  options: { untilMs: number; logger: Logger; retryMs?: number },
): Promise<void> {
  const retryMs = options.retryMs ?? HOLD_RELEASE_RETRY_MS
  try {
    await release()
    return
  } catch (error) {
    options.logger.warn(
      { err: error, ...what },
      'releasing a session hold failed; trying again until the database takes it',
    )
  }
  const again = () => {
    if (Date.now() > options.untilMs) return
    const timer = setTimeout(() => {
      release().then(
        () => options.logger.info(what, 'a session hold released once the database answered again'),
        again,
      )
    }, retryMs)
    timer.unref()
  }
  again()
}
