import { TestPostgres } from '../test/helpers/postgres.js'
import { type Counted, countStatements, tally } from '../test/helpers/statements.js'
import { type Bench, progress, timedResult } from './lib/bench.js'
import { EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row } from './lib/stats.js'
import { TURN_CASES, turnSender } from './lib/turns.js'

const TURNS = 20
const WARMUP = 3
/** Issue 33's goal for PostgreSQL. */
const GOAL_POSTGRES = 8

/**
 * The statements a warm echo turn sends its database, on SQLite and on PostgreSQL (a local
 * cluster started by the bench), `begin` and `commit` included: those sent before the turn's
 * answer ended, and those that follow it. Each statement is listed with its count per turn.
 */
export const turnStatements: Bench = {
  name: 'turn-statements',
  description: 'statements per warm echo turn on SQLite and PostgreSQL, listed (~30 s)',
  run: () =>
    timedResult('turn-statements', async () => {
      const postgres = await TestPostgres.start()
      const rows: Row[] = []
      const notes: string[] = []
      const echo = TURN_CASES.find((c) => c.name === 'echo')
      if (!echo) throw new Error('no echo turn case')
      let onPostgres = Number.NaN
      try {
        for (const database of ['sqlite', 'postgres'] as const) {
          progress(`${database}: ${TURNS} warm turns`)
          const server = await startBenchServer({
            server: {
              reaperIntervalMs: 3_600_000,
              ...(database === 'postgres' ? { database: await postgres.createDatabase() } : {}),
            },
          })
          try {
            await server.deploy(`${EXAMPLES}/echo`)
            const session = await server.createSession('echo', { keepWarmMs: 10 * 60_000 })
            const problems: string[] = []
            const sender = turnSender(session.id, echo, problems)
            for (let i = 0; i < WARMUP; i++) await sender.send(server.http)
            const turns: Counted[] = []
            for (let i = 0; i < TURNS; i++)
              turns.push(
                await countStatements(server.server.statements, async () => {
                  await sender.send(server.http)
                }),
              )
            if (problems.length > 0) throw new Error(`${database}: ${problems[0]}`)
            rows.push(
              { ...row(`${database}: statements per warm turn`, turns.map(total)), unit: 'statements' },
              {
                ...row(
                  `${database}: of which after the answer`,
                  turns.map((t) => t.after.length),
                ),
                unit: 'statements',
              },
            )
            const all = turns.flatMap((t) => [...t.answered, ...t.after.map((s) => `(after) ${s}`)])
            notes.push(`${database}, per turn (${TURNS} turns):`)
            for (const [sql, n] of tally(all)) notes.push(`  ${(n / TURNS).toFixed(2)} × ${sql}`)
            if (database === 'postgres') onPostgres = Math.max(...turns.map(total))
          } finally {
            await server.close()
          }
        }
      } finally {
        await postgres.stop()
      }
      return {
        config: {
          turns: TURNS,
          warmup: WARMUP,
          agent: 'echo',
          counted: 'every statement, begin and commit included',
        },
        rows,
        notes,
        targets: [
          {
            name: 'PostgreSQL statements per warm turn (most of any turn)',
            goal: `≤ ${GOAL_POSTGRES}`,
            value: onPostgres,
            met: onPostgres <= GOAL_POSTGRES,
            unit: 'statements',
          },
        ],
      }
    }),
}

function total(turn: Counted): number {
  return turn.answered.length + turn.after.length
}
