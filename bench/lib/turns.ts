import { repeat } from './bench.js'
import type { Client, StreamTiming } from './client.js'

/** Turns on warm sessions: the agents, the loop and the HTTP floor the warm-turn benches share. */

export interface TurnCase {
  name: 'echo' | 'notes'
  prompt: (i: number) => string
  expect: (i: number) => string
}

export const TURN_CASES: readonly TurnCase[] = [
  { name: 'echo', prompt: (i) => `ping ${i}`, expect: (i) => `ping ${i}\n` },
  { name: 'notes', prompt: (i) => `fact number ${i}`, expect: (i) => `Noted: fact number ${i}\n` },
]

/** Think time between paced turns: enough for the work a turn leaves behind (its snapshot). */
export const PACED_GAP_MS = 25

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** GET /healthz `runs` times, after 20 unmeasured: the HTTP round trip alone, with `client`. */
export async function healthzSamples(client: Client, runs: number): Promise<number[]> {
  const samples: number[] = []
  for (let i = 0; i < 20; i++) await client.json('GET', '/healthz')
  for (let i = 0; i < runs; i++) {
    const res = await client.json('GET', '/healthz')
    if (res.status !== 200) throw new Error(`/healthz answered ${res.status}`)
    samples.push(res.ms)
  }
  return samples
}

export interface TurnSender {
  /** One turn, POST /v1/sessions/{id}/messages to `run.completed`, with the next prompt. */
  send(client: Client): Promise<StreamTiming>
  /** Turns sent so far. */
  readonly count: number
}

/**
 * The turns of one session, numbered from 0: each reply is checked, and every turn after the
 * first must find the agent warm; what went wrong is added to `problems`.
 */
export function turnSender(sessionId: string, c: TurnCase, problems: string[]): TurnSender {
  const route = `/v1/sessions/${sessionId}/messages`
  let turn = 0
  return {
    get count() {
      return turn
    },
    async send(client) {
      const i = turn++
      const t = await client.stream(route, { prompt: c.prompt(i) })
      if (t.terminal !== 'run.completed' || t.text !== c.expect(i))
        problems.push(`turn ${i}: ${t.status} ${t.terminal} ${JSON.stringify(t.text)} ${t.error ?? ''}`)
      if (i > 0 && t.coldStart !== false) problems.push(`turn ${i}: not warm (coldStart=${t.coldStart})`)
      return t
    },
  }
}

/** `turns` turns with `client`, each after a think time of `gapMs`, as in a conversation. */
export async function pacedTurns(
  sender: TurnSender,
  client: Client,
  turns: number,
  gapMs: number,
  budgetMs: number,
): Promise<{ timings: StreamTiming[]; truncated: boolean }> {
  const timings: StreamTiming[] = []
  const { truncated } = await repeat(turns, budgetMs, async () => {
    await sleep(gapMs)
    timings.push(await sender.send(client))
  })
  return { timings, truncated }
}

/** Message POST issued -> `run.completed` received, per turn. */
export function roundTrips(timings: readonly StreamTiming[]): number[] {
  return timings.map((t) => t.completedMs as number)
}
