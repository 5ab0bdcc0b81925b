import { ConnectionLost, type ModelClient, Violation } from './client.js'
import {
  type Content,
  describeSet,
  type FilePath,
  type Model,
  namesLoss,
  PATHS,
  type SessionEvent,
  type SessionModel,
  short,
} from './model.js'

/**
 * The bounds the model test holds the server to (docs/architecture.md, "The model-based fault
 * test"): after any fault, once the server answers again, no session stays `active` or answers
 * `409 session_busy` longer than SETTLE_BOUND_MS; a server signalled to stop exits within
 * STOP_BOUND_MS and leaves nothing mounted under its run dir.
 */
export const SETTLE_BOUND_MS = 10_000
export const STOP_BOUND_MS = 30_000

/** What a sequence (and all of them) did: printed at the end of the test. */
export class Stats {
  runs = 0
  steps = 0
  readonly operations = new Map<string, number>()
  readonly faults = new Map<string, number>()
  readonly invariants = new Map<string, number>()

  count(map: Map<string, number>, key: string, by = 1): void {
    map.set(key, (map.get(key) ?? 0) + by)
  }

  summary(): string {
    const list = (map: Map<string, number>) =>
      [...map]
        .sort(([a], [b]) => a.localeCompare(b))
        .map(([k, n]) => `${k}=${n}`)
        .join(' ')
    const checked = [...this.invariants.values()].reduce((a, b) => a + b, 0)
    return [
      `sequences started: ${this.runs}, steps: ${this.steps}`,
      `operations: ${list(this.operations) || 'none'}`,
      `faults injected: ${list(this.faults) || 'none'}`,
      `invariants checked: ${checked} (${list(this.invariants)})`,
    ].join('\n')
  }
}

/**
 * The system under test as the steps see it: a client of its API (one server's, or every API
 * replica's), what the sequence did, and the log to show when an invariant breaks. A test bed
 * extends it with its faults (`SingleServer`, `ClusterSystem`).
 */
export abstract class Real {
  /** The steps of this sequence so far (for failure reports). */
  readonly trace: string[] = []

  constructor(
    public client: ModelClient,
    readonly stats: Stats,
  ) {}

  /** The last `lines` lines of the system's logs. */
  abstract logTail(lines: number): string

  /**
   * Runs `fault` with `503` answers of `codes` taken as answers, not violations: what the docs
   * promise a client while that fault lasts (PostgreSQL down: `unavailable`; a node down: `node_lost`).
   */
  async during<T>(codes: readonly string[], fault: () => Promise<T>): Promise<T> {
    const before = this.client.allowed503
    this.client.allowed503 = codes
    try {
      return await fault()
    } finally {
      this.client.allowed503 = before
    }
  }

  /** Repeats `call` while it answers 409 session_busy, up to SETTLE_BOUND_MS. */
  async unlessBusy<T extends { status: number; body: unknown }>(
    what: string,
    call: () => Promise<T>,
  ): Promise<T> {
    const deadline = Date.now() + SETTLE_BOUND_MS
    for (;;) {
      const answer = await call()
      if (answer.status !== 409 || codeOf(answer.body) !== 'session_busy') return answer
      if (Date.now() > deadline)
        throw new Violation(
          `${what}: still 409 session_busy ${SETTLE_BOUND_MS} ms on: ${JSON.stringify(answer.body)}`,
        )
      await sleep(200)
    }
  }
}

/** A problem answer's stable code (`{"error": {"code": …}}`). */
export function codeOf(body: unknown): string | undefined {
  const code = (body as { error?: { code?: unknown } } | undefined)?.error?.code
  return typeof code === 'string' ? code : undefined
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** A 4xx must be a typed problem (a stable code), whatever the operation. */
export function expectTyped(what: string, answer: { status: number; body: unknown }): string {
  const code = codeOf(answer.body)
  if (code === undefined)
    throw new Violation(`${what}: ${answer.status} without a typed code: ${JSON.stringify(answer.body)}`)
  return code
}

/** Checks every invariant against every session the model knows; throws a Violation on the first broken one. */
export async function checkInvariants(model: Model, real: Real): Promise<void> {
  for (const session of model.sessions) {
    if (session.deleted) continue
    await checkSession(model, real, session)
  }
}

async function checkSession(model: Model, real: Real, session: SessionModel): Promise<void> {
  const { stats } = real
  const status = await settledStatus(real, session)
  model.seen(session, status)
  if (status === 'deleted') {
    const events = await eventsOf(real, session)
    stats.count(stats.invariants, 'deletions named and allowed')
    const cause = events.filter((e) => e.to === 'deleted').at(-1)?.cause
    if (cause === 'retention' && session.retentionMayDelete) {
      session.deleted = true
      return
    }
    throw new Violation(
      `${session.label} (${session.id}) was deleted (cause ${cause}) though the model keeps it (retention ${JSON.stringify(model.retention)})`,
    )
  }
  const found = new Map<FilePath, Content>()
  const wrong: string[] = []
  for (const path of PATHS) {
    const content = await readContent(real, session, path)
    found.set(path, content)
    stats.count(stats.invariants, 'acknowledged writes readable')
    const allowed = session.files.get(path)
    if (!allowed?.has(content))
      wrong.push(`${path}: read ${short(content)}, the model allows ${describeSet(allowed)}`)
  }
  // The events after the files: a read of a session whose node was declared lost sets off its
  // recovery from the bucket, whose event (naming what did not make it) is written with it; read
  // before the files, they missed it (the cluster soak's "silent" losses, seed 654197258).
  const events = await eventsOf(real, session)
  const losses = events.filter(namesLoss)
  const newLosses = losses.slice(session.lossEvents)
  stats.count(stats.invariants, 'losses named')
  if (wrong.length > 0 && newLosses.length === 0)
    throw new Violation(
      `${session.label} (${session.id}) lost or changed acknowledged state, named nowhere:\n  ${wrong.join('\n  ')}`,
    )
  stats.count(stats.invariants, 'nothing readable reported lost')
  if (newLosses.length > 0 && wrong.length === 0 && (await namesAcknowledged(real, session, newLosses)))
    throw new Violation(
      `${session.label} (${session.id}) reported a loss though every acknowledged write is readable: ${JSON.stringify(newLosses)}`,
    )
  if (newLosses.length > 0) {
    // A named loss: from here on the model goes by what the workspace holds.
    session.lossEvents = losses.length
    for (const [path, content] of found) session.files.set(path, new Set([content]))
  }
}

async function eventsOf(real: Real, session: SessionModel): Promise<SessionEvent[]> {
  const events = (await real.client.call('GET', `/v1/sessions/${session.id}/events`)).body?.data as
    | SessionEvent[]
    | undefined
  if (!events) throw new Violation(`${session.label}: no events list`)
  return events
}

/** The session's status once it is not `active`; a violation if it stays active past the bound. */
async function settledStatus(real: Real, session: SessionModel): Promise<string> {
  const deadline = Date.now() + SETTLE_BOUND_MS
  real.stats.count(real.stats.invariants, 'not active past the bound')
  for (;;) {
    const answer = await real.client.call('GET', `/v1/sessions/${session.id}`)
    if (answer.status !== 200)
      throw new Violation(`${session.label}: GET answered ${answer.status} ${JSON.stringify(answer.body)}`)
    const status = answer.body.status as string
    if (status !== 'active') return status
    if (Date.now() > deadline)
      throw new Violation(
        `${session.label} (${session.id}) still active ${SETTLE_BOUND_MS} ms after the step`,
      )
    await sleep(200)
  }
}

/**
 * Whether `losses` name something acknowledged: a `state_lost`, or a recovery that names changes
 * made outside turns or a turn that completed. (A recovery that names only turns that failed
 * names changes that may never have been made: the model allows either.)
 */
async function namesAcknowledged(real: Real, session: SessionModel, losses: SessionEvent[]) {
  if (losses.some((e) => e.cause !== 'node_recovered' || e.detail?.includes('outside turns'))) return true
  const named = new Set(
    losses.flatMap((e) => [...(e.detail ?? '').matchAll(/\((trn_[^)\s]+)\)/g)].map((m) => m[1])),
  )
  const turns = (await real.client.call('GET', `/v1/sessions/${session.id}/turns`)).body?.data as
    | { id: string; status: string }[]
    | undefined
  return (turns ?? []).some((t) => named.has(t.id) && t.status === 'completed')
}

async function readContent(real: Real, session: SessionModel, path: FilePath): Promise<Content> {
  const route = `/v1/sessions/${session.id}/files/content?path=${encodeURIComponent(path)}`
  const answer = await real.unlessBusy(`${session.label} read ${path}`, () =>
    real.client.call('GET', route).then((a) => ({ ...a, body: a.body ?? {} })),
  )
  if (answer.status === 200) return answer.bytes.toString('base64')
  if (answer.status === 404) return null
  throw new Violation(`${session.label} read ${path}: ${answer.status} ${JSON.stringify(answer.body)}`)
}

export { ConnectionLost }
