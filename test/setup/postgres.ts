import { POSTGRES_ADMIN_URL_ENV, TestPostgres, testsRunOnPostgres } from '../helpers/postgres.js'

/**
 * Vitest global setup: when the suite runs on PostgreSQL (CAIRN_TEST_DATABASE=postgres), one real
 * cluster serves the whole run; each test server gets a database of its own in it
 * (`testDatabaseUrl`). The workers inherit its address through the environment.
 */
export default async function setup(): Promise<(() => Promise<void>) | undefined> {
  if (!testsRunOnPostgres()) return undefined
  const postgres = await TestPostgres.start()
  process.env[POSTGRES_ADMIN_URL_ENV] = postgres.url()
  return async () => {
    await postgres.stop()
  }
}
