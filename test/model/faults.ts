import fc from 'fast-check'
import { ConnectionLost, type TurnStream, Violation } from './client.js'
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

/**
 * Starts `inFlight` against the model's session `index`, and returns what to do with the model
 * once the server is down: the operation's answer, if it came, decides.
 */
function startInFlight(
  model: Model,
  real: Real,
  inFlight: InFlight,
  target: { index: number; path: FilePath; content: Content; which: number },
): () => Promise<void> {
  const session = model.pick(target.index)
  if (!session || inFlight === 'nothing') return async () => undefined
  if (inFlight === 'turn') {
    const prompt = `sleep 0.3; ${writeCommand(target.path, target.content)}; sleep 0.3`
    const turn = real.client.startTurn(session.id, prompt)
    return async () => {
      const outcome = await turn.done
      if (outcome.terminal === 'run.completed') model.acknowledged(session, target.path, target.content)
      else model.unacknowledged(session, target.path, target.content)
    }
  }
  if (inFlight === 'file write') {
    const route = `/v1/sessions/${session.id}/files/content?path=${encodeURIComponent(target.path)}`
    const answer = real.client
      .call('PUT', route, Buffer.from(target.content ?? '', 'base64'), 'application/octet-stream')
      .catch((error) => (error instanceof ConnectionLost ? undefined : Promise.reject(error)))
    return async () => {
      if ((await answer)?.status === 200) model.acknowledged(session, target.path, target.content)
      else model.unacknowledged(session, target.path, target.content)
    }
  }
  const snapshot = session.snapshots[target.which % Math.max(1, session.snapshots.length)]
  if (inFlight === 'restore' && snapshot) {
    const before = copyFiles(session.files)
    const answer = real.client
      .call('POST', `/v1/sessions/${session.id}/restore`, { snapshotId: snapshot.id })
      .catch((error) => (error instanceof ConnectionLost ? undefined : Promise.reject(error)))
    return async () => {
      const status = (await answer)?.status
      if (status === 200) session.files = copyFiles(snapshot.files)
      else if (status === undefined) session.files = eitherFiles(before, snapshot.files)
    }
  }
  if (inFlight === 'snapshot') {
    const files = copyFiles(session.files)
    const answer = real.client
      .call('POST', `/v1/sessions/${session.id}/snapshots`, { label: 'in-flight' })
      .catch((error) => (error instanceof ConnectionLost ? undefined : Promise.reject(error)))
    return async () => {
      const got = await answer
      if (got?.status === 201) session.snapshots.push({ id: got.body.id, files })
    }
  }
  return async () => undefined
}

/** kill -9 of the server process (its sandboxes live on), then a start on the same data dir. */
export class KillServer extends Step {
  readonly kind = 'kill -9 server'
  protected override readonly fault = true
  constructor(
    readonly inFlight: InFlight,
    readonly target: { index: number; path: FilePath; content: Content; which: number },
    readonly delayMs: number,
  ) {
    super()
  }
  protected override get needsSession() {
    return false
  }
  protected async apply(model: Model, real: Real) {
    const settle = startInFlight(model, real, this.inFlight, this.target)
    await sleep(this.delayMs)
    await real.server.kill9()
    await settle()
    await real.restart()
  }
  toString() {
    return `kill -9 server (${this.inFlight} in flight, after ${this.delayMs} ms)`
  }
}

/**
 * SIGTERM to the server's process group (a terminal's Ctrl-C, systemd's KillMode=control-group):
 * the server must exit within the stop bound leaving nothing mounted; then it is started again.
 */
export class TerminateGroup extends Step {
  readonly kind = 'SIGTERM process group'
  protected override readonly fault = true
  constructor(
    readonly inFlight: InFlight,
    readonly target: { index: number; path: FilePath; content: Content; which: number },
    readonly delayMs: number,
  ) {
    super()
  }
  protected override get needsSession() {
    return false
  }
  protected async apply(model: Model, real: Real) {
    const settle = startInFlight(model, real, this.inFlight, this.target)
    await sleep(this.delayMs)
    await real.stopAndCheck('group')
    await settle()
    await real.restart()
  }
  toString() {
    return `SIGTERM group (${this.inFlight} in flight, after ${this.delayMs} ms)`
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
    model.unacknowledged(session, this.path, this.content)
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
    else model.unacknowledged(session, this.path, this.content)
  }
  toString() {
    return `drop connection(${this.index}, ${this.path}, after ${this.delayMs} ms)`
  }
}

const inFlightTarget = fc.record({ index, path: filePath, content, which: fc.nat(8) })

export function faults(): fc.Arbitrary<Step>[] {
  return [
    fc
      .tuple(fc.constantFrom(...IN_FLIGHT), inFlightTarget, fc.nat({ max: 900 }))
      .map(([f, t, d]) => new KillServer(f, t, d)),
    fc
      .tuple(fc.constantFrom(...IN_FLIGHT), inFlightTarget, fc.nat({ max: 900 }))
      .map(([f, t, d]) => new TerminateGroup(f, t, d)),
    fc.tuple(index, filePath, content).map(([i, p, c]) => new KillAgent(i, p, c)),
    fc
      .tuple(index, filePath, content, fc.nat({ max: 600 }))
      .map(([i, p, c, d]) => new DropStream(i, p, c, d)),
  ]
}
