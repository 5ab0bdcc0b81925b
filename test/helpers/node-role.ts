import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { systemClock } from '../../packages/server/src/clock.js'
import { openDatabase } from '../../packages/server/src/db/database.js'
import { syncSharedFiles } from '../../packages/server/src/local-runtime.js'
import type { TestPostgres } from './postgres.js'

/**
 * A node's database credential as an operator makes it (docs/cluster.md, "The nodes' role"): a
 * login role of its own in `cairn_node`, and nothing else. The database is readied first as the
 * first API replica readies it (migrated, the cluster's egress CA and secrets key stored): a node
 * may do neither. `role` names the login role (one per node: a restarted node keeps it); `host` is
 * where the node reaches PostgreSQL. Resolves to the node's `--database` URL.
 */
export async function nodeDatabaseUrl(
  postgres: TestPostgres,
  databaseUrl: string,
  options: { role: string; host?: string },
): Promise<string> {
  const db = await openDatabase(databaseUrl)
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-node-role-'))
  try {
    await syncSharedFiles(db, dir, systemClock, { secretKey: true })
  } finally {
    await db.close()
    await rm(dir, { recursive: true, force: true })
  }
  if (!/^[a-z_][a-z0-9_]*$/.test(options.role)) throw new Error(`not a plain role name: ${options.role}`)
  await postgres.sql(
    `DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '${options.role}') THEN CREATE ROLE ${options.role} LOGIN IN ROLE cairn_node; END IF; END $$`,
  )
  const url = new URL(postgres.url(new URL(databaseUrl).pathname.slice(1), options.host))
  url.username = options.role
  return url.toString()
}
