import fc from 'fast-check'
import { Violation } from './client.js'
import {
  type Content,
  copyFiles,
  emptyFiles,
  type FilePath,
  type Model,
  PATHS,
  type RetentionModel,
  type SessionModel,
  type SnapshotModel,
} from './model.js'
import { Step, unexpected } from './step.js'
import { codeOf, type Real, SETTLE_BOUND_MS } from './system.js'
import { endsWithin, eventsOf, openTurn, uniqueSleep, writeCommand } from './turns.js'

/** Most sessions a sequence keeps live at once (creates and forks wait below it). */
export const MAX_SESSIONS = 4
export const AGENT = 'shell'

/** Picks a live session by index; the step's `check` guarantees there is one. */
function target(model: Model, index: number): SessionModel {
  const session = model.pick(index)
  if (!session) throw new Error('no live session (check() should have prevented this step)')
  return session
}

export class Create extends Step {
  readonly kind = 'create'
  protected override get needsSession() {
    return false
  }
  override check(model: Readonly<Model>) {
    return model.live().length < MAX_SESSIONS
  }
  protected async apply(model: Model, real: Real) {
    const answer = await real.client.call('POST', '/v1/sessions', { agent: AGENT })
    if (answer.status !== 201) throw new Violation(`create: ${answer.status} ${JSON.stringify(answer.body)}`)
    model.add(answer.body.id, emptyFiles())
  }
  toString() {
    return 'create'
  }
}

/** A turn whose agent writes `content` to `path`: acknowledged once it completes. */
export class Message extends Step {
  readonly kind = 'message'
  constructor(
    readonly index: number,
    readonly path: FilePath,
    readonly content: Content,
  ) {
    super()
  }
  protected async apply(model: Model, real: Real) {
    const session = target(model, this.index)
    const opened = await openTurn(real, session, writeCommand(this.path, this.content))
    if ('refused' in opened) return unexpected(session, 'message', opened.refused)
    const outcome = await opened.turn.done
    if (outcome.terminal !== 'run.completed')
      throw new Violation(`${session.label} message: no fault, yet the turn ended ${eventsOf(outcome)}`)
    model.acknowledged(session, this.path, this.content)
  }
  toString() {
    return `message(${this.index}, ${this.path})`
  }
}

/** A long turn (it writes, then sleeps ~30 s) cancelled `delayMs` after it started. */
export class Cancel extends Step {
  readonly kind = 'cancel'
  constructor(
    readonly index: number,
    readonly path: FilePath,
    readonly content: Content,
    readonly delayMs: number,
  ) {
    super()
  }
  protected async apply(model: Model, real: Real) {
    const session = target(model, this.index)
    const prompt = `${writeCommand(this.path, this.content)}; sleep ${uniqueSleep()}`
    const opened = await openTurn(real, session, prompt)
    if ('refused' in opened) return unexpected(session, 'message', opened.refused)
    model.interrupted(session, this.path, this.content)
    await new Promise((r) => setTimeout(r, this.delayMs))
    const answer = await real.client.call('POST', `/v1/sessions/${session.id}/cancel`)
    if (answer.status !== 200) unexpected(session, 'cancel', answer)
    const outcome = await endsWithin(`${session.label} cancel`, opened.turn, SETTLE_BOUND_MS)
    if (outcome.terminal !== 'run.cancelled')
      throw new Violation(`${session.label} cancel: the turn ended ${eventsOf(outcome)}`)
  }
  toString() {
    return `cancel(${this.index}, ${this.path}, after ${this.delayMs} ms)`
  }
}

/** `PUT …/files/content`: acknowledged by its 200. */
export class ApiWrite extends Step {
  readonly kind = 'file write'
  constructor(
    readonly index: number,
    readonly path: FilePath,
    readonly content: Content,
  ) {
    super()
  }
  protected async apply(model: Model, real: Real) {
    const session = target(model, this.index)
    const route = `/v1/sessions/${session.id}/files/content?path=${encodeURIComponent(this.path)}`
    const bytes = Buffer.from(this.content ?? '', 'base64')
    const answer = await real.unlessBusy(`${session.label} file write`, () =>
      real.client.call('PUT', route, bytes, 'application/octet-stream'),
    )
    if (answer.status !== 200) return unexpected(session, 'file write', answer)
    model.acknowledged(session, this.path, this.content)
  }
  toString() {
    return `write(${this.index}, ${this.path})`
  }
}

export class Snapshot extends Step {
  readonly kind = 'snapshot'
  constructor(readonly index: number) {
    super()
  }
  protected async apply(model: Model, real: Real) {
    const session = target(model, this.index)
    const answer = await real.unlessBusy(`${session.label} snapshot`, () =>
      real.client.call('POST', `/v1/sessions/${session.id}/snapshots`, { label: 'model' }),
    )
    if (answer.status !== 201) return unexpected(session, 'snapshot', answer)
    session.snapshots.push({ id: answer.body.id, files: copyFiles(session.files) })
  }
  toString() {
    return `snapshot(${this.index})`
  }
}

/** The snapshot `which` picks among the session's manual ones, if it has any. */
function snapshotOf(model: Readonly<Model>, index: number, which: number) {
  const session = model.pick(index)
  if (!session || session.snapshots.length === 0) return undefined
  return {
    session,
    snapshot: session.snapshots[which % session.snapshots.length] as SessionModel['snapshots'][0],
  }
}

/**
 * A snapshot refused: `404` only where retention may have deleted it, `409 snapshot_left_behind`
 * only where the session may have moved since it was taken (it then leaves the model).
 */
function snapshotGone(
  session: SessionModel,
  snapshot: SnapshotModel,
  what: string,
  answer: { status: number; body: unknown },
) {
  const gone = answer.status === 404 && session.retentionMayDeleteSnapshots
  const leftBehind =
    answer.status === 409 && codeOf(answer.body) === 'snapshot_left_behind' && snapshot.mayBeLeftBehind
  if (gone || leftBehind) {
    session.snapshots = session.snapshots.filter((s) => s.id !== snapshot.id)
    return
  }
  unexpected(session, what, answer)
}

export class Restore extends Step {
  readonly kind = 'restore'
  constructor(
    readonly index: number,
    readonly which: number,
  ) {
    super()
  }
  override check(model: Readonly<Model>) {
    return snapshotOf(model, this.index, this.which) !== undefined
  }
  protected async apply(model: Model, real: Real) {
    const { session, snapshot } = snapshotOf(model, this.index, this.which) ?? {}
    if (!session || !snapshot) throw new Error('no snapshot to restore')
    const answer = await real.unlessBusy(`${session.label} restore`, () =>
      real.client.call('POST', `/v1/sessions/${session.id}/restore`, { snapshotId: snapshot.id }),
    )
    if (answer.status !== 200) return snapshotGone(session, snapshot, 'restore', answer)
    session.files = copyFiles(snapshot.files)
  }
  toString() {
    return `restore(${this.index}, snapshot ${this.which})`
  }
}

export class Fork extends Step {
  readonly kind = 'fork'
  constructor(
    readonly index: number,
    readonly which: number,
  ) {
    super()
  }
  override check(model: Readonly<Model>) {
    return model.live().length < MAX_SESSIONS && snapshotOf(model, this.index, this.which) !== undefined
  }
  protected async apply(model: Model, real: Real) {
    const { session, snapshot } = snapshotOf(model, this.index, this.which) ?? {}
    if (!session || !snapshot) throw new Error('no snapshot to fork')
    const answer = await real.unlessBusy(`${session.label} fork`, () =>
      real.client.call('POST', `/v1/sessions/${session.id}/fork`, { snapshotId: snapshot.id }),
    )
    if (answer.status !== 201) return snapshotGone(session, snapshot, 'fork', answer)
    model.add(answer.body.id, copyFiles(snapshot.files))
  }
  toString() {
    return `fork(${this.index}, snapshot ${this.which})`
  }
}

export class End extends Step {
  readonly kind = 'end'
  constructor(readonly index: number) {
    super()
  }
  protected async apply(model: Model, real: Real) {
    const session = target(model, this.index)
    const answer = await real.unlessBusy(`${session.label} end`, () =>
      real.client.call('POST', `/v1/sessions/${session.id}/end`),
    )
    if (answer.status !== 200) return unexpected(session, 'end', answer)
    model.seen(session, answer.body.status)
  }
  toString() {
    return `end(${this.index})`
  }
}

export class Resume extends Step {
  readonly kind = 'resume'
  constructor(readonly index: number) {
    super()
  }
  protected async apply(model: Model, real: Real) {
    const session = target(model, this.index)
    const answer = await real.unlessBusy(`${session.label} resume`, () =>
      real.client.call('POST', `/v1/sessions/${session.id}/resume`),
    )
    // A session that is not ended is not resumable: a typed refusal, nothing changed.
    if (answer.status === 409 && codeOf(answer.body) === 'session_not_resumable') return
    if (answer.status !== 200) return unexpected(session, 'resume', answer)
    model.seen(session, answer.body.status)
  }
  toString() {
    return `resume(${this.index})`
  }
}

export class Delete extends Step {
  readonly kind = 'delete'
  constructor(readonly index: number) {
    super()
  }
  protected async apply(model: Model, real: Real) {
    const session = target(model, this.index)
    const answer = await real.unlessBusy(`${session.label} delete`, () =>
      real.client.call('DELETE', `/v1/sessions/${session.id}`),
    )
    if (answer.status !== 200) return unexpected(session, 'delete', answer)
    session.deleted = true
    const after = await real.client.call('GET', `/v1/sessions/${session.id}`)
    real.stats.count(real.stats.invariants, 'deletions named and allowed')
    if (after.status === 200 && after.body.status !== 'deleted')
      throw new Violation(`${session.label}: deleted, then GET shows ${after.body.status}`)
  }
  toString() {
    return `delete(${this.index})`
  }
}

export class Retention extends Step {
  readonly kind = 'retention'
  constructor(readonly policy: RetentionModel) {
    super()
  }
  protected override get needsSession() {
    return false
  }
  protected async apply(model: Model, real: Real) {
    const answer = await real.client.call('PUT', '/v1/retention', this.policy)
    if (answer.status !== 200)
      throw new Violation(`retention: ${answer.status} ${JSON.stringify(answer.body)}`)
    for (const [field, value] of Object.entries(this.policy))
      if (answer.body[field] !== value)
        throw new Violation(
          `retention: set ${field} ${JSON.stringify(value)}, answered ${JSON.stringify(answer.body)}`,
        )
    model.retention = { ...this.policy }
    for (const session of model.live()) model.seen(session, session.lastStatus)
  }
  toString() {
    return `retention(${JSON.stringify(this.policy)})`
  }
}

export const index = fc.nat({ max: MAX_SESSIONS * 2 })
export const filePath = fc.constantFrom(...PATHS)
/** Contents are random bytes (8 to 48): two writes are told apart by what they wrote. */
export const content = fc
  .uint8Array({ minLength: 8, maxLength: 48 })
  .map((bytes) => Buffer.from(bytes).toString('base64'))

/** A TTL: none (keep), one that never fires within a sequence, or one that fires at the next sweep. */
const ttl = fc.constantFrom<number | null>(null, 24 * 3600_000, 0)

export function operations(): fc.Arbitrary<Step>[] {
  return [
    fc.constant(null).map(() => new Create()),
    fc.tuple(index, filePath, content).map(([i, p, c]) => new Message(i, p, c)),
    fc.tuple(index, filePath, content).map(([i, p, c]) => new Message(i, p, c)),
    fc.tuple(index, filePath, content, fc.nat({ max: 500 })).map(([i, p, c, d]) => new Cancel(i, p, c, d)),
    fc.tuple(index, filePath, content).map(([i, p, c]) => new ApiWrite(i, p, c)),
    fc.tuple(index, filePath, content).map(([i, p, c]) => new ApiWrite(i, p, c)),
    index.map((i) => new Snapshot(i)),
    fc.tuple(index, fc.nat(8)).map(([i, w]) => new Restore(i, w)),
    fc.tuple(index, fc.nat(8)).map(([i, w]) => new Fork(i, w)),
    index.map((i) => new End(i)),
    index.map((i) => new Resume(i)),
    index.map((i) => new Delete(i)),
    fc
      .record({
        keepAutoSnapshots: fc.integer({ min: 1, max: 5 }),
        endedSnapshotTtlMs: ttl,
        endedWorkspaceTtlMs: ttl,
      })
      .map((policy) => new Retention(policy)),
  ]
}
