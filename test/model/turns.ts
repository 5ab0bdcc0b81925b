import { type TurnOutcome, type TurnStream, Violation } from './client.js'
import type { Content, FilePath, SessionModel } from './model.js'
import { codeOf, type Real, SETTLE_BOUND_MS, sleep } from './system.js'

/** The shell agent's command line that writes `content` (base64) to `path` in the workspace. */
export function writeCommand(path: FilePath, content: Content): string {
  return `printf '%s' '${content ?? ''}' | base64 -d > ${path}`
}

let markers = 0

/**
 * A `sleep` of about 30 s whose argument is unique on the machine, so the agent running it can be
 * found through /proc (and so it outlasts anything that should end it first).
 */
export function uniqueSleep(): string {
  markers += 1
  return `30.${process.pid}${String(markers).padStart(5, '0')}`
}

export type Opened = { turn: TurnStream } | { refused: TurnOutcome }

/**
 * Sends `prompt`, repeating it while the session answers 409 session_busy (up to the settle
 * bound); resolves once the run streams (its first event) or with the refusal.
 */
export async function openTurn(real: Real, session: SessionModel, prompt: string): Promise<Opened> {
  const deadline = Date.now() + SETTLE_BOUND_MS
  for (;;) {
    const turn = real.client.startTurn(session.id, prompt)
    const status = await turn.head
    if (status === 200) {
      await turn.started
      return { turn }
    }
    const refused = await turn.done
    if (status !== 409 || codeOf(refused.body) !== 'session_busy') return { refused }
    if (Date.now() > deadline)
      throw new Violation(
        `${session.label}: a message still got 409 session_busy ${SETTLE_BOUND_MS} ms on: ${JSON.stringify(refused.body)}`,
      )
    await sleep(200)
  }
}

/** The turn's outcome, or a violation if it has not ended within `boundMs`. */
export async function endsWithin(what: string, turn: TurnStream, boundMs: number): Promise<TurnOutcome> {
  let timer: NodeJS.Timeout | undefined
  const outcome = await Promise.race([
    turn.done,
    new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), boundMs)
    }),
  ])
  clearTimeout(timer)
  if (outcome === undefined) {
    turn.abort()
    await turn.done.catch(() => undefined)
    throw new Violation(`${what}: the turn's stream had not ended ${boundMs} ms later`)
  }
  return outcome
}

/** The event types of an outcome, for failure messages. */
export function eventsOf(outcome: TurnOutcome): string {
  return JSON.stringify(outcome.events.filter((e) => e.type !== 'message.delta')).slice(0, 800)
}
