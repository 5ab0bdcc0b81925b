/**
 * What the runtime logs through: a subset of pino's API (the server passes its pino logger), so
 * `logger.warn({ err, sandboxId }, 'message')` reads the same in both. The default logs nothing.
 */
export interface Logger {
  debug(fields: object, message?: string): void
  info(fields: object, message?: string): void
  warn(fields: object, message?: string): void
  error(fields: object, message?: string): void
}

const ignore = (): void => {}

/** The logger of a runtime given none: it drops everything. */
export const noopLogger: Logger = { debug: ignore, info: ignore, warn: ignore, error: ignore }

/**
 * A `.catch` handler for a step the caller can go on without (a cleanup, a best-effort probe): it
 * logs the error with `fields` at `level` and resolves to undefined. Say on the line above why going
 * on is safe.
 */
export function logAndGoOn(
  logger: Logger,
  level: 'debug' | 'warn',
  fields: object,
  message: string,
): (err: unknown) => undefined {
  return (err) => {
    logger[level]({ ...fields, err }, message)
    return undefined
  }
}
