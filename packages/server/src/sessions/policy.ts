import {
  CairnProblem,
  DEFAULT_IDLE_TIMEOUT_MS,
  DEFAULT_KEEP_WARM_MS,
  type OnTimeoutAction,
  type SessionPolicy,
  type SessionPolicyInput,
} from '@cairn/protocol'

/** The policy a session gets when a request names none of its fields. */
export const DEFAULT_POLICY: SessionPolicy = {
  idleTimeoutMs: DEFAULT_IDLE_TIMEOUT_MS,
  keepWarmMs: DEFAULT_KEEP_WARM_MS,
  maxTurns: null,
  maxDurationMs: null,
  onTimeout: 'keep',
  approvalTimeoutMs: null,
}

/** The policy columns of a session row. */
export interface PolicyColumns {
  idle_timeout_ms: number
  keep_warm_ms: number
  max_turns: number | null
  max_duration_ms: number | null
  on_timeout: string
  approval_timeout_ms: number | null
}

export function policyOf(row: PolicyColumns): SessionPolicy {
  return {
    idleTimeoutMs: row.idle_timeout_ms,
    keepWarmMs: row.keep_warm_ms,
    maxTurns: row.max_turns,
    maxDurationMs: row.max_duration_ms,
    onTimeout: row.on_timeout === 'destroy' ? 'destroy' : ('keep' satisfies OnTimeoutAction),
    approvalTimeoutMs: row.approval_timeout_ms ?? null,
  }
}

/** `base` with the fields the request gives replaced (`null` clears a limit, absent keeps it). */
export function applyPolicy(base: SessionPolicy, input: SessionPolicyInput | undefined): SessionPolicy {
  if (!input) return base
  return {
    idleTimeoutMs: input.idleTimeoutMs ?? base.idleTimeoutMs,
    keepWarmMs: input.keepWarmMs ?? base.keepWarmMs,
    maxTurns: input.maxTurns === undefined ? base.maxTurns : input.maxTurns,
    maxDurationMs: input.maxDurationMs === undefined ? base.maxDurationMs : input.maxDurationMs,
    onTimeout: input.onTimeout ?? base.onTimeout,
    approvalTimeoutMs:
      input.approvalTimeoutMs === undefined ? base.approvalTimeoutMs : input.approvalTimeoutMs,
  }
}

/**
 * The create body's policy: `idleTimeoutMs`/`keepWarmMs` may also sit at the top level (the
 * shorter spelling); given in both places with different values, the request is refused rather
 * than one of them silently winning.
 */
export function createPolicy(body: {
  idleTimeoutMs?: number | undefined
  keepWarmMs?: number | undefined
  policy?: SessionPolicyInput | undefined
}): SessionPolicy {
  for (const field of ['idleTimeoutMs', 'keepWarmMs'] as const) {
    const top = body[field]
    const nested = body.policy?.[field]
    if (top !== undefined && nested !== undefined && top !== nested) {
      throw new CairnProblem(
        'validation_failed',
        `${field} is given twice with different values (${top} and policy.${field} ${nested})`,
        { field },
      )
    }
  }
  return applyPolicy(DEFAULT_POLICY, {
    ...body.policy,
    ...(body.idleTimeoutMs === undefined ? {} : { idleTimeoutMs: body.idleTimeoutMs }),
    ...(body.keepWarmMs === undefined ? {} : { keepWarmMs: body.keepWarmMs }),
  })
}

/** When `maxDurationMs` runs out if its clock starts at `startMs`. */
export function deadlineFor(policy: SessionPolicy, startMs: number): string | null {
  return policy.maxDurationMs === null ? null : new Date(startMs + policy.maxDurationMs).toISOString()
}

/** A new session row's policy columns; its `maxDurationMs` clock starts at `startMs`. */
export function policyColumns(
  policy: SessionPolicy,
  startMs: number,
): PolicyColumns & { deadline_at: string | null } {
  return {
    idle_timeout_ms: policy.idleTimeoutMs,
    keep_warm_ms: policy.keepWarmMs,
    max_turns: policy.maxTurns,
    max_duration_ms: policy.maxDurationMs,
    deadline_at: deadlineFor(policy, startMs),
    on_timeout: policy.onTimeout,
    approval_timeout_ms: policy.approvalTimeoutMs,
  }
}

/** The row fields the limits are checked against. */
export interface LimitedRow extends PolicyColumns {
  id: string
  status: string
  status_cause: string
  turn_count: number
  deadline_at: string | null
}

/** The policy `input` would give a session; refuses one whose `maxTurns` it has already used up. */
export function changedPolicy(row: LimitedRow, input: SessionPolicyInput | undefined): SessionPolicy {
  const policy = applyPolicy(policyOf(row), input)
  if (policy.maxTurns !== null && row.turn_count >= policy.maxTurns) {
    throw new CairnProblem(
      'turn_limit_reached',
      `session ${row.id} has used ${row.turn_count} of its ${policy.maxTurns} turns; give a higher maxTurns (or null), or fork it`,
      { maxTurns: policy.maxTurns, turnCount: row.turn_count },
    )
  }
  return policy
}

/**
 * Why the policy refuses another message, if it does: `maxTurns` used up, or `maxDurationMs` run
 * out (`timeoutNow`: the session is still idle and should move to `timeout` at once, the reaper
 * not having come by yet).
 */
export function limitReached(
  row: LimitedRow,
  nowMs: number,
): { problem: CairnProblem; timeoutNow: boolean } | undefined {
  if (row.max_turns !== null && row.turn_count >= row.max_turns) {
    return {
      timeoutNow: false,
      problem: new CairnProblem(
        'turn_limit_reached',
        `session ${row.id} has had ${row.max_turns === 1 ? 'its one turn' : `all ${row.max_turns} of its turns`} (policy maxTurns ${row.max_turns}); resume it with a higher maxTurns or fork it`,
        { maxTurns: row.max_turns, turnCount: row.turn_count },
      ),
    }
  }
  const pastDeadline = row.deadline_at !== null && Date.parse(row.deadline_at) <= nowMs
  if (!pastDeadline && !(row.status === 'timeout' && row.status_cause === 'max_duration')) return undefined
  return {
    timeoutNow: pastDeadline && row.status === 'idle',
    problem: new CairnProblem(
      'duration_limit_reached',
      `session ${row.id} ran past its maxDurationMs (${row.max_duration_ms} ms, deadline ${row.deadline_at}); resume it to start the clock again`,
      { maxDurationMs: row.max_duration_ms, deadlineAt: row.deadline_at },
    ),
  }
}
