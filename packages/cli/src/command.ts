import { type Command, InvalidArgumentError } from 'commander'
import type { Context } from './context.js'
import { isBareNumber, parseDuration } from './format/time.js'

export type Register = (parent: Command, ctx: Context) => void

/** `--json` is taken out of argv before parsing (so it works anywhere); declared here for `--help`. */
export function jsonOption(command: Command): Command {
  return command.option('--json', 'print machine-readable JSON on stdout')
}

/** Parses a positive integer option; anything else is a usage error (exit 2). */
export function positiveInt(value: string): number {
  const n = Number(value)
  if (!Number.isInteger(n) || n <= 0) throw new InvalidArgumentError('expected a positive integer')
  return n
}

/** A positive number (fractions allowed, as in `--max-cpus 0.5`). */
export function positiveNumber(value: string): number {
  const n = Number(value)
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError('expected a positive number')
  return n
}

/** A port: 0 to 65535. */
export function positiveIntOrZero(value: string): number {
  const n = Number(value)
  if (!Number.isInteger(n) || n < 0 || n > 65535)
    throw new InvalidArgumentError('expected a port number (0-65535)')
  return n
}

/** The error for a duration flag's value; a bare number is told to add its unit. */
export function durationError(value: string): InvalidArgumentError {
  return new InvalidArgumentError(
    isBareNumber(value)
      ? `a duration needs its unit: ${value}s (seconds), ${value}ms, or 30m, 1h, 7d`
      : 'expected a duration such as 90s, 30m, 1h or 7d',
  )
}

/** A duration with its unit: `250ms`, `90s`, `5m`, `1h`, `7d` (a bare number is refused, not guessed). */
export function duration(value: string): number {
  const ms = parseDuration(value)
  if (ms === undefined || ms <= 0) throw durationError(value)
  return ms
}
