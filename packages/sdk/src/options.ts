import { nearestKey } from '@cairn/protocol/core'
import { ValidationError } from './errors.js'

/** The keys of `RequestOptions`, accepted by every call that takes options. */
export const REQUEST_OPTION_KEYS = ['signal', 'timeoutMs'] as const

/**
 * Refuses an option the call does not read, so that a misspelt or foreign option (`idleTimout`,
 * another product's `idleTimeoutSeconds`) is an error instead of a setting silently left at its
 * default. TypeScript refuses them in object literals; this covers JavaScript and spread objects.
 */
export function assertKnownOptions(call: string, options: object, known: readonly string[]): void {
  for (const [key, value] of Object.entries(options)) {
    if (known.includes(key) || value === undefined) continue
    const near = nearestKey(key, known)
    throw new ValidationError({
      code: 'validation_failed',
      message: `unknown option '${key}' for ${call}${near ? `; did you mean '${near}'?` : ''} (known: ${known.join(', ')})`,
    })
  }
}

/**
 * The idle timeout in milliseconds from `idleTimeout` (seconds, as in the hosted products' SDKs:
 * `idleTimeout: 3600` is an hour) or `idleTimeoutMs`; both at once is an error, since they could disagree.
 */
export function idleTimeoutMsOf(
  call: string,
  options: { idleTimeout?: number | undefined; idleTimeoutMs?: number | undefined },
): number | undefined {
  const { idleTimeout, idleTimeoutMs } = options
  if (idleTimeout === undefined) return idleTimeoutMs
  if (idleTimeoutMs !== undefined) {
    throw new ValidationError({
      code: 'validation_failed',
      message: `${call}: give idleTimeout (seconds) or idleTimeoutMs (milliseconds), not both`,
    })
  }
  if (typeof idleTimeout !== 'number' || !Number.isFinite(idleTimeout) || idleTimeout <= 0) {
    throw new ValidationError({
      code: 'validation_failed',
      message: `${call}: idleTimeout is a number of seconds greater than 0, not ${String(idleTimeout)}`,
    })
  }
  return Math.round(idleTimeout * 1000)
}
