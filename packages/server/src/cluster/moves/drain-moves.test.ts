import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { Writable } from 'node:stream'
import { sql } from 'kysely'
import pino from 'pino'
import { afterAll, describe, expect, it } from 'vitest'
import { openDatabase } from '../../db/database.js'
import { DrainMoves } from './drain-moves.js'

const dirs: string[] = []
afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
})

describe('drain moves', () => {
  it('a round whose database fails is logged and leaves the process running (found by the cluster model test: PostgreSQL restarted crashed the leading replica)', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-drain-moves-'))
    dirs.push(dir)
    const db = await openDatabase(path.join(dir, 'cairn.db'))
    // The leader's query fails, as every one does while PostgreSQL restarts.
    await sql`DROP TABLE turns`.execute(db.q)
    const lines: string[] = []
    const logger = pino(
      { level: 'warn' },
      new Writable({
        write(chunk, _encoding, done) {
          lines.push(chunk.toString())
          done()
        },
      }),
    )
    const unhandled: unknown[] = []
    const onUnhandled = (reason: unknown) => unhandled.push(reason)
    process.on('unhandledRejection', onUnhandled)
    try {
      // The round fails at its first query: no session is ever handed to the mover.
      const drain = new DrainMoves({ db, mover: undefined as never, logger })
      await drain.pass()
      await drain.settle()
      await new Promise((resolve) => setTimeout(resolve, 50))
    } finally {
      process.off('unhandledRejection', onUnhandled)
    }
    await db.close()
    expect(unhandled).toEqual([])
    expect(lines.join('')).toContain('a round of drain moves failed')
  })
})
