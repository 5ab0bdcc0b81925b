export const EXIT = { ok: 0, error: 1, usage: 2, cancelled: 130 } as const

/** A failure the CLI explains itself: `✗ message` and an optional hint; exit 1 unless told otherwise. */
export class CliError extends Error {
  readonly hint: string | undefined
  readonly exitCode: number
  readonly code: string | undefined
  constructor(message: string, options: { hint?: string; exitCode?: number; code?: string } = {}) {
    super(message)
    this.name = 'CliError'
    this.hint = options.hint
    this.exitCode = options.exitCode ?? EXIT.error
    this.code = options.code
  }
}

/** Wrong arguments: exit 2. */
export class UsageError extends CliError {
  constructor(message: string, hint?: string) {
    super(message, { exitCode: EXIT.usage, code: 'usage', ...(hint === undefined ? {} : { hint }) })
    this.name = 'UsageError'
  }
}

/** The user cancelled (Ctrl-C): exit 130. */
export class CancelledError extends CliError {
  constructor(message = 'Cancelled') {
    super(message, { exitCode: EXIT.cancelled, code: 'cancelled' })
    this.name = 'CancelledError'
  }
}
