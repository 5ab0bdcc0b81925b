import { CairnProblem } from '@cairn/protocol/core'
import { CliError } from './errors.js'

/**
 * A server or node start refused for what this host lacks (`cairn doctor`'s checks, named in the
 * problem's details) points at `cairn doctor` instead of at the server's log.
 */
export function explainHostRefusal(error: unknown): never {
  if (error instanceof CairnProblem && Array.isArray(error.details?.checks))
    throw new CliError(error.message, {
      code: error.code,
      hint: '`cairn doctor` shows every check: what works, what a missing one costs, and how to fix it',
    })
  throw error
}
