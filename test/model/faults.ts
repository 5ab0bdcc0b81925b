import fc from 'fast-check'
import { ConnectionLost, type ModelClient, type TurnStream, Violation } from './client.js'
import { type Content, copyFiles, eitherFiles, type FilePath, type Model } from './model.js'
import { content, filePath, index } from './operations.js'
import { agentPidRunning } from './server-process.js'
import { Step } from './step.js'
import { type Real, SETTLE_BOUND_MS, sleep } from './system.js'
import { endsWithin, eventsOf, openTurn, uniqueSleep, writeCommand } from './turns.js'

/**
 * What was in flight when the server went down. (A file write in flight once left the file
 * truncated, neither its acknowledged old bytes nor the new ones: seed 642968815, path 4.)
 */
export const IN_FLIGHT = ['nothing', 'turn', 'file write', 'restore', 'snapshot'] as const
export type InFlight = (typeof IN_FLIGHT)[number]

export interface InFlightTarget {
  index: number
  path: FilePath
  content: Content
  which: number
}

/**
 * Starts `inFlight` through `client` against the model's session `index`, and returns what to do
 * with the model once the fault struck: the operation's answer, if it came, decides.
 */
export function startInFlight(
  model: Model,
  client: ModelClient,
  inFlight: InFlight,
  target: InFlightTarget,
): () => Promise<void> {
  const session = model.pick(target.index)
  if (!session || inFlight === 'nothing') return async () => undefined
  if (inFlight === 'turn') {
    const prompt = `sleep 0.3; ${writeCommand(target.path, target.content)}; sleep 0.3`
    const turn = client.startTurn(session.id, prompt)
    // Its rejection (a violation) is taken by the settle below; until then it is not unhandled.
    turn.done.catch(() => undefined)
    return async () => {
      const outcome = await turn.done
      if (outcome.terminal === 'run.completed') model.acknowledged(session, target.path, target.content)
      else model.interrupted(session, target.path, target.content)
    }
  }
  if (inFlight === 'file write') {
    const route = `/v1/sessions/${session.id}/files/content?path=${encodeURIComponent(target.path)}`
    const answer = client
      .call('PUT', route, Buffer.from(target.content ?? '', 'base64'), 'application/octet-stream')
      .catch((error) => (error instanceof ConnectionLost ? undefined : Promise.reject(error)))
    answer.catch(() => undefined)
    return async () => {
      if ((await answer)?.status === 200) model.acknowledged(session, target.path, target.content)
      else model.unacknowledged(session, target.path, target.content)
    }
  }
  const snapshot = session.snapshots[target.which % Math.max(1, session.snapshots.length)]
  if (inFlight === 'restore' && snapshot) {
    const before = copyFiles(session.files)
    const answer = client
      .call('POST', `/v1/sessions/${session.id}/restore`, { snapshotId: snapshot.id })
      .catch((error) => (error instanceof ConnectionLost ? undefined : Promise.reject(error)))
    answer.catch(() => undefined)
    return async () => {
      const status = (await answer)?.status
      if (status === 200) session.files = copyFiles(snapshot.files)
      // No answer, or a 503 the fault allowed: the swap on the node may have been made before
      // the database went away (a 503 says try again, not that nothing changed; a restore again
      // makes the same workspace). A 4xx refused it before anything was touched.
      else if (status === undefined || status >= 500) session.files = eitherFiles(before, snapshot.files)
    }
  }
  if (inFlight === 'snapshot') {
    const files = copyFiles(session.files)
    const answer = client
      .call('POST', `/v1/sessions/${session.id}/snapshots`, { label: 'in-flight' })
      .catch((error) => (error instanceof ConnectionLost ? undefined : Promise.reject(error)))
    answer.catch(() => undefined)
    return async () => {
      const got = await answer
      if (got?.status === 201) session.snapshots.push({ id: got.body.id, files })
    }
  }
  return async () => undefined
}

/**
 * A fault that strikes `delayMs` after an operation (`inFlight`) was started, then is recovered
 * from (the process started again): the operation's answer, if it came, tells the model what happened.
 * While it lasts, `503`s with the codes of `windowCodes` are answers (what the docs promise then).
 */
export abstract class InFlightFault<S extends Real> extends Step<S> {
  protected override readonly fault = true
  protected readonly windowCodes: readonly string[] = []

  constructor(
    readonly inFlight: InFlight,
    readonly target: InFlightTarget,
    readonly delayMs: number,
  ) {
    super()
  }
  protected override get needsSession() {
    return false
  }
  /** The client the operation in flight goes through. */
  protected clientOf(real: S): ModelClient {
    return real.client
  }
  protected abstract strike(real: S): Promise<void>
  protected abstract recover(real: S): Promise<void>
  protected abstract get label(): string

  protected async apply(model: Model, real: S) {
    await real.during(this.windowCodes, async () => {
      const settle = startInFlight(model, this.clientOf(real), this.inFlight, this.target)
      await sleep(this.delayMs)
      await this.strike(real)
      await settle()
      await this.recover(real)
    })
  }
  toString() {
    return `${this.label} (${this.inFlight} in flight, after ${this.delayMs} ms)`
  }
}

/** kill -9 of the agent inside its sandbox mid-turn (found through /proc): the turn fails, nothing else. */
export class KillAgent extends Step {
  readonly kind = 'kill -9 agent'
  protected override readonly fault = true
  constructor(
    readonly index: number,
    readonly path: FilePath,
    readonly content: Content,
  ) {
    super()
  }
  protected async apply(model: Model, real: Real) {
    const session = model.pick(this.index)
    if (!session) return
    const marker = uniqueSleep()
    const opened = await openTurn(real, session, `${writeCommand(this.path, this.content)}; sleep ${marker}`)
    if ('refused' in opened)
      throw new Violation(`${session.label}: message refused ${JSON.stringify(opened.refused.body)}`)
    model.interrupted(session, this.path, this.content)
    const pid = await findAgent(marker, opened.turn)
    if (pid === undefined) {
      opened.turn.abort()
      const outcome = await opened.turn.done
      throw new Violation(
        `${session.label}: no agent running sleep ${marker} found; the turn: ${eventsOf(outcome)}`,
      )
    }
    process.kill(pid, 'SIGKILL')
    const outcome = await endsWithin(`${session.label} agent killed`, opened.turn, SETTLE_BOUND_MS)
    if (outcome.terminal !== 'run.failed')
      throw new Violation(`${session.label}: agent killed, yet the turn ended ${eventsOf(outcome)}`)
  }
  toString() {
    return `kill -9 agent(${this.index}, ${this.path})`
  }
}

async function findAgent(marker: string, turn: TurnStream): Promise<number | undefined> {
  const deadline = Date.now() + SETTLE_BOUND_MS
  let ended = false
  void turn.done.finally(() => {
    ended = true
  })
  while (Date.now() < deadline && !ended) {
    const pid = agentPidRunning(marker)
    if (pid !== undefined) return pid
    await sleep(50)
  }
  return undefined
}

/** The client drops its connection `delayMs` into a turn (the fetch is aborted). */
export class DropStream extends Step {
  readonly kind = 'dropped connection'
  protected override readonly fault = true
  constructor(
    readonly index: number,
    readonly path: FilePath,
    readonly content: Content,
    readonly delayMs: number,
  ) {
    super()
  }
  protected async apply(model: Model, real: Real) {
    const session = model.pick(this.index)
    if (!session) return
    const prompt = `sleep 0.2; ${writeCommand(this.path, this.content)}; sleep 0.5`
    const opened = await openTurn(real, session, prompt)
    if ('refused' in opened)
      throw new Violation(`${session.label}: message refused ${JSON.stringify(opened.refused.body)}`)
    await sleep(this.delayMs)
    opened.turn.abort()
    const outcome = await opened.turn.done
    if (outcome.terminal === 'run.completed') model.acknowledged(session, this.path, this.content)
    else model.interrupted(session, this.path, this.content)
  }
  toString() {
    return `drop connection(${this.index}, ${this.path}, after ${this.delayMs} ms)`
  }
}

export const inFlightTarget = fc.record({ index, path: filePath, content, which: fc.nat(8) })

/** What is in flight when a fault strikes, and how long after it began. */
export const inFlight = fc.tuple(fc.constantFrom(...IN_FLIGHT), inFlightTarget, fc.nat({ max: 900 }))

/** The faults of every test bed: an agent killed, a client's connection dropped. */
export function faults(): fc.Arbitrary<Step>[] {
  return [
    fc.tuple(index, filePath, content).map(([i, p, c]) => new KillAgent(i, p, c)),
    fc
      .tuple(index, filePath, content, fc.nat({ max: 600 }))
      .map(([i, p, c, d]) => new DropStream(i, p, c, d)),
  ]
}
