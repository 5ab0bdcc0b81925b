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
