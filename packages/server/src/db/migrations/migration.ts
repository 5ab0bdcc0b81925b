/** The two databases Cairn runs on. */
export type Dialect = 'sqlite' | 'postgres'

/**
 * One schema migration: applied once, in version order, recorded in `schema_migrations`. Written
 * in SQLite's dialect; `forDialect` (index.ts) turns it into PostgreSQL's. `dialectSql` is what the
 * two spell too differently for that (triggers), appended as given.
 */
export interface Migration {
  version: number
  name: string
  sql: string
  dialectSql?: (dialect: Dialect) => string
}
