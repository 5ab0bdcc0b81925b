import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'
import { type Counted, countStatements, tally } from './helpers/statements.js'

// What a warm turn costs the database, counted statement by statement (a count, not a time):
// `begin` and `commit` included, each a round trip on PostgreSQL. The ceiling holds on both
// databases; docs/architecture.md ("The database work of a warm turn") says what each one is for.
const CEILINGS = { sqlite: 14, postgres: 8 }
const CEILING = CEILINGS[process.env.CAIRN_TEST_DATABASE === 'postgres' ? 'postgres' : 'sqlite']
const WARM_TURNS = 3

/**
 * What a turn sends after its answer is counted with it until the server has been quiet for a
 * second: on a loaded machine (CI, other test files beside this one) the gap between two of its
 * statements passed the helper's default 200 ms, and the rest landed in the next turn's count
 * (15 > 14 on SQLite).
 */
const QUIET_MS = 1000

let t: TestServer
let sessionId: string

beforeAll(async () => {
  // No reaper pass meanwhile: what is counted is the turn's alone.
  t = await startTestServer({ reaperIntervalMs: 3_600_000 })
  expect((await t.api.deploy(path.join(EXAMPLES, 'echo'))).status).toBe(201)
  sessionId = (await t.api.createSession('echo', { keepWarmMs: 600_000 })).id
  // The first turn starts the agent (and leaves its snapshot behind); the ones counted find it
  // warm, after two more that are not counted.
  for (const prompt of ['cold', 'warm', 'warm again'])
    expect((await t.api.send(sessionId, prompt)).terminal?.type).toBe('run.completed')
  // The last one's work after its answer (its snapshot's range) is not the first counted turn's.
  await countStatements(t.server.statements, async () => {}, QUIET_MS)
}, 120_000)

afterAll(async () => {
  await t?.close()
})

async function warmTurn(i: number): Promise<Counted> {
  return countStatements(
    t.server.statements,
    async () => {
      const run = await t.api.send(sessionId, `ping ${i}`)
      expect(run.terminal).toMatchObject({ type: 'run.completed', text: `ping ${i}\n` })
      expect(run.events.find((e) => e.type === 'run.started')).toMatchObject({ coldStart: false })
    },
    QUIET_MS,
  )
}

describe('the statements of a warm turn', () => {
  it(`a warm echo turn sends at most ${CEILING} statements`, async () => {
    const turns: Counted[] = []
    for (let i = 0; i < WARM_TURNS; i++) turns.push(await warmTurn(i))
    const most = turns.reduce((a, b) => (total(b) > total(a) ? b : a))
    const listed = tally([...most.answered, ...most.after.map((sql) => `(after) ${sql}`)])
    console.log(
      `a warm turn on ${process.env.CAIRN_TEST_DATABASE ?? 'sqlite'}: ${most.answered.length} statements, then ${most.after.length}\n${[...listed].map(([sql, n]) => `${n} × ${sql}`).join('\n')}`,
    )
    for (const turn of turns) expect(total(turn)).toBeLessThanOrEqual(CEILING)
  })
})

function total(turn: Counted): number {
  return turn.answered.length + turn.after.length
}
