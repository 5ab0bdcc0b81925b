import type { SessionPolicyInput } from '@cairn/sdk'
import { type Command, InvalidArgumentError } from 'commander'
import { duration, durationError, positiveInt } from './command.js'
import { parseDuration } from './format/time.js'

export interface PolicyFlags {
  idleTimeout?: number
  keepWarm?: number
  maxTurns?: number | null
  maxDuration?: number | null
  onTimeout?: 'keep' | 'destroy'
}

const orNone =
  <T>(parse: (value: string) => T) =>
  (value: string): T | null =>
    value === 'none' ? null : parse(value)

function durationOrZero(value: string): number {
  const ms = parseDuration(value)
  if (ms === undefined || ms < 0) throw durationError(value)
  return ms
}

function onTimeout(value: string): 'keep' | 'destroy' {
  if (value !== 'keep' && value !== 'destroy') throw new InvalidArgumentError('expected keep or destroy')
  return value
}

/** The lifecycle policy flags, shared by the commands that create or resume a session. */
export function policyOptions(command: Command): Command {
  return command
    .option(
      '--idle-timeout <duration>',
      'idle this long → status timeout (with its unit: 3600s, 30m, 1h, 7d; a bare number is refused)',
      duration,
    )
    .option(
      '--keep-warm <duration>',
      'keep the sandbox warm this long after a turn (0: stop at once)',
      durationOrZero,
    )
    .option('--max-turns <n>', 'end the session after this many turns (none: no limit)', orNone(positiveInt))
    .option(
      '--max-duration <duration>',
      'time the session out this long after it starts or resumes (none: no limit)',
      orNone(duration),
    )
    .option(
      '--on-timeout <action>',
      'keep (the workspace stays) or destroy (deleted at the timeout)',
      onTimeout,
    )
}

/** The policy fields the flags name, or `undefined` when none was given (the server's values stand). */
export function policyFromFlags(flags: PolicyFlags): SessionPolicyInput | undefined {
  const policy: SessionPolicyInput = {}
  if (flags.idleTimeout !== undefined) policy.idleTimeoutMs = flags.idleTimeout
  if (flags.keepWarm !== undefined) policy.keepWarmMs = flags.keepWarm
  if (flags.maxTurns !== undefined) policy.maxTurns = flags.maxTurns
  if (flags.maxDuration !== undefined) policy.maxDurationMs = flags.maxDuration
  if (flags.onTimeout !== undefined) policy.onTimeout = flags.onTimeout
  return Object.keys(policy).length > 0 ? policy : undefined
}
