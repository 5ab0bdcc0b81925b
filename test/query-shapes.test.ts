import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import fc from 'fast-check'
import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Db, openDatabase } from '../packages/server/src/db/database.js'
import { testDatabaseFor } from './fixtures/test-database.mjs'

// The warm turn's statements are compiled once per shape and run again with other values
// (packages/server/src/db/query-shapes.ts): each run must write and read its own values, on
// SQLite and on PostgreSQL (where strings lose their NUL as the query plugin makes them).

let dataDir: string
let db: Db

beforeAll(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-shapes-'))
  db = await openDatabase((await testDatabaseFor(dataDir)) ?? path.join(dataDir, 'cairn.db'))
}, 60_000)

afterAll(async () => {
  await db?.close()
  if (dataDir) await rm(dataDir, { recursive: true, force: true })
})

const insertTenant = (id: string, name: string, createdAt: string) =>
  db.shaped('test tenant', { id, name, createdAt }, (q, a) =>
    q.insertInto('tenants').values({ id: a.id, name: a.name, created_at: a.createdAt }),
  )

const tenantNamed = async (name: string) =>
  (
    await db.shaped('test tenant by name', { name }, (q, a) =>
      q.selectFrom('tenants').select(['id', 'name']).where('name', '=', a.name).orderBy('id'),
    )
  ).rows

describe('statements compiled once per shape', () => {
  it('writes and reads the values of each run, not those it was compiled with', async () => {
    const names = ['first', 'second', 'third\u0000with a NUL', "it's 'quoted'"]
    for (const [i, name] of names.entries()) await insertTenant(`tnt_shape${i}`, name, `2026-01-0${i + 1}`)
    const stored = db.dialect === 'postgres' ? (name: string) => name.replace('\u0000', '\uFFFD') : String
    for (const [i, name] of names.entries())
      expect(await tenantNamed(stored(name))).toEqual([{ id: `tnt_shape${i}`, name: stored(name) }])
    const changed = await db.shaped('test tenant renamed', { id: 'tnt_shape1', name: 'renamed' }, (q, a) =>
      q.updateTable('tenants').set({ name: a.name }).where('id', '=', a.id),
    )
    expect(changed.changed).toBe(1n)
    expect(await tenantNamed('second')).toEqual([])
    expect(await tenantNamed('renamed')).toEqual([{ id: 'tnt_shape1', name: 'renamed' }])
  })

  it('stores and finds any value as the statement Kysely compiles each time does (generated values)', async () => {
    // Texts of every kind: NULs anywhere, lone surrogates, the stand-ins' own marks, quotes,
    // SQL-looking text; what the shaped statement writes and finds must be what the unshaped one does.
    const marks = fc.constantFrom(
      '\uE000cairn-arg-0\uE001',
      '\uE000cairn-arg-1\uE001',
      String(-(2 ** 52)),
      '$1',
      '?',
    )
    const texts = fc.oneof(
      fc.string({ unit: 'binary', maxLength: 24 }),
      fc.string({ unit: fc.constantFrom('\u0000', '\ud800', "'", '\\', 'a', '\uE000'), maxLength: 8 }),
      marks,
      fc.tuple(fc.string({ maxLength: 4 }), marks).map(([a, b]) => `${a}${b}`),
    )
    let n = 0
    await fc.assert(
      fc.asyncProperty(texts, async (name) => {
        const [shapedId, plainId] = [`tnt_gen_s${n}`, `tnt_gen_p${n++}`]
        await insertTenant(shapedId, name, '2026-03-01')
        await db.q.insertInto('tenants').values({ id: plainId, name, created_at: '2026-03-01' }).execute()
        const byId = await db.q
          .selectFrom('tenants')
          .select(['id', 'name'])
          .where('id', 'in', [shapedId, plainId])
          .orderBy('id')
          .execute()
        expect(byId.map((row) => row.name)).toEqual([byId[0]?.name, byId[0]?.name])
        const plainFound = await db.q
          .selectFrom('tenants')
          .select(['id', 'name'])
          .where('name', '=', name)
          .where('id', 'in', [shapedId, plainId])
          .orderBy('id')
          .execute()
        const shapedFound = (await tenantNamed(name)).filter((row) =>
          [shapedId, plainId].includes(row.id as string),
        )
        expect(shapedFound).toEqual(plainFound)
      }),
      { numRuns: 60, seed: 33 },
    )
  })

  it('runs inside the enclosing transaction, and is rolled back with it', async () => {
    await expect(
      db.transaction(async () => {
        await insertTenant('tnt_shape_rolled', 'rolled back', '2026-02-01')
        expect(await tenantNamed('rolled back')).toHaveLength(1)
        throw new Error('roll back')
      }),
    ).rejects.toThrow('roll back')
    expect(await tenantNamed('rolled back')).toEqual([])
  })

  it('refuses a statement that would keep a value of its first run', async () => {
    // An argument made into part of a larger parameter, or written into the text, would be
    // the first run's for ever: refused when the shape is compiled.
    await expect(
      db.shaped('test folded', { name: 'sec' }, (q, a) =>
        q.selectFrom('tenants').select('id').where('name', 'like', `${a.name}%`),
      ),
    ).rejects.toThrow(/folded one of its arguments/)
    await expect(
      db.shaped('test inlined', { name: 'sec' }, (q, a) =>
        q.selectFrom('tenants').select('id').where('name', '=', sql.lit(a.name)),
      ),
    ).rejects.toThrow(/inlined one of its arguments/)
    await expect(
      db.shaped('test inlined number', { n: 2 }, (q, a) =>
        q
          .selectFrom('tenants')
          .select((eb) => eb.case().when('name', '=', 'x').then(a.n).else(0).end().as('n')),
      ),
    ).rejects.toThrow(/inlined one of its arguments/)
    await expect(
      db.shaped('test computed', { n: 2 }, (q, a) =>
        q
          .selectFrom('tenants')
          .select('id')
          .where(sql<boolean>`length(name) = ${(a.n as number) + 1}`),
      ),
    ).rejects.toThrow(/folded one of its arguments/)
  })
})
