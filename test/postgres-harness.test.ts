import pg from 'pg'
import { describe, expect, it } from 'vitest'
import { TestPostgres, testDatabaseUrl, testsRunOnPostgres } from './helpers/postgres.js'

// The harness the PostgreSQL runs of the suite stand on: a real cluster of our own, databases per
// server, dropped connections and restarts on demand.
describe('test PostgreSQL', () => {
  it('starts a cluster, creates databases, survives a restart and drops connections', async () => {
    const postgres = await TestPostgres.start()
    try {
      const url = await postgres.createDatabase('cairn_harness')
      expect(url).toContain(`:${postgres.port}/cairn_harness`)
      await postgres.sql('CREATE TABLE t (v int); INSERT INTO t VALUES (41)', 'cairn_harness')
      await postgres.restart()
      expect(await postgres.sql('SELECT v + 1 FROM t', 'cairn_harness')).toBe('42')
      // A client of ours is cut (psql's own backends may still be exiting: at least ours is counted).
      const client = new pg.Client({ connectionString: url })
      const cut = new Promise<Error>((resolve) => client.on('error', resolve)) // it may say so twice
      await client.connect()
      expect(await postgres.terminateConnections('cairn_harness')).toBeGreaterThanOrEqual(1)
      expect((await cut).message).toMatch(/terminat/)
      await client.end().catch(() => undefined)
    } finally {
      await postgres.stop()
    }
  }, 120_000)
})

describe.runIf(testsRunOnPostgres())('the suite on PostgreSQL', () => {
  it('gives each test server a database of its own in the run’s cluster', async () => {
    const first = await testDatabaseUrl()
    const second = await testDatabaseUrl()
    expect(first).toMatch(/^postgres:\/\/postgres@127\.0\.0\.1:\d+\/cairn_[0-9a-f]{12}$/)
    expect(second).not.toBe(first)
  })
})
