import { mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { loadClusterTls, RemoteRuntimePort } from '@cairn/runtime/port'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, spawnCli } from '../../../../test/helpers/cli.js'
import { nodeDatabaseUrl } from '../../../../test/helpers/node-role.js'
import { TestPostgres } from '../../../../test/helpers/postgres.js'
import { initClusterTls } from '../../../runtime/src/port/remote/cluster-tls.js'
import { eventually } from '../../test/cluster-rows.js'
import { NodeStore } from '../cluster/node-store.js'
import { type Db, openDatabase } from '../db/database.js'
import { type RunningNode, startNode } from './start-node.js'

// `cairn node` as a library: a real runtime (plain-directory pool), its port served over mutual
// TLS, registered in a real PostgreSQL; fenced when PostgreSQL goes away, back when it returns.
let postgres: TestPostgres
let url: string
let db: Db
let clusterDir: string
let dataDir: string
let node: RunningNode | undefined
let client: RemoteRuntimePort | undefined

beforeAll(async () => {
  postgres = await TestPostgres.start()
  url = await postgres.createDatabase()
  db = await openDatabase(url)
  clusterDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-cluster-control-tls-'))
  await initClusterTls(clusterDir)
  dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-cluster-control-node-'))
}, 120_000)

afterAll(async () => {
  await client?.close()
  await node?.close()
  await db?.close()
  await postgres?.stop()
  await rm(clusterDir, { recursive: true, force: true })
  await rm(dataDir, { recursive: true, force: true })
})

describe('cairn node', () => {
  it('refuses to start without PostgreSQL, with a typed error', async () => {
    const saved = process.env.CAIRN_DATABASE_URL
    delete process.env.CAIRN_DATABASE_URL
    try {
      const error = await startNode({ dataDir, clusterDir, storage: 'dir' }).catch((e: unknown) => e)
      expect(error).toBeInstanceOf(CairnProblem)
      expect(error).toMatchObject({ code: 'validation_failed', details: { option: 'database' } })
      await expect(
        startNode({ dataDir, clusterDir, storage: 'dir', database: `${dataDir}/cairn.db` }),
      ).rejects.toMatchObject({
        code: 'validation_failed',
      })
    } finally {
      if (saved !== undefined) process.env.CAIRN_DATABASE_URL = saved
    }
  })

  it('serves its runtime, registers, fences itself while PostgreSQL is down, registers again, deregisters on close', async () => {
    node = await startNode({
      dataDir,
      clusterDir,
      storage: 'dir',
      database: await nodeDatabaseUrl(postgres, url, { role: 'cairn_node_a' }),
      listen: '127.0.0.1:0',
      name: 'node-a',
      heartbeatMs: 100,
      leaseMs: 800,
      logLevel: 'silent',
    })
    expect(node.nodeId).toBe((await readFile(path.join(dataDir, 'runtime-id'), 'utf8')).trim())
    expect(node.address).toBe(node.url)
    const store = new NodeStore(db)
    const row = await store.get(node.nodeId)
    expect(row).toMatchObject({
      name: 'node-a',
      state: 'ready',
      epoch: 1,
      address: node.url,
      leaseLive: true,
    })
    expect(row.drivers).toContain('bwrap')
    expect(row.cpus).toBe(os.availableParallelism())
    expect(row.poolFreeBytes).toBeGreaterThan(0)

    client = new RemoteRuntimePort({ url: node.url, tls: await loadClusterTls(clusterDir, 'api') })
    expect(await client.warmCount()).toBe(0)

    await postgres.stopServer()
    try {
      await eventually(async () => node?.registry.isFenced(), 5000)
      const refused = await client.warmCount().catch((e: unknown) => e)
      expect(refused).toMatchObject({ code: 'node_fenced' })
    } finally {
      await postgres.startServer()
    }
    await eventually(async () => !node?.registry.isFenced(), 20_000)
    expect(await client.warmCount()).toBe(0)
    expect(await store.get(node.nodeId)).toMatchObject({ state: 'ready', epoch: 2, leaseLive: true })

    await node.close()
    node = undefined
    expect(await store.get(row.id)).toMatchObject({ state: 'stopped', epoch: 2, leaseLive: false })
  })

  it('`cairn node` runs until SIGTERM, then deregisters', async () => {
    assertBuilt()
    const cliDataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-cluster-control-cli-'))
    try {
      const run = spawnCli(
        [
          'node',
          '--json',
          '--listen',
          '127.0.0.1:0',
          '--storage',
          'dir',
          '--data-dir',
          cliDataDir,
          '--name',
          'cli-node',
        ],
        {
          CAIRN_DATABASE_URL: url,
          CAIRN_CLUSTER_DIR: clusterDir,
          CAIRN_HEARTBEAT_MS: '200',
          CAIRN_LEASE_MS: '1000',
        },
      )
      const line = await eventually(
        async () =>
          run
            .output()
            .stdout.split('\n')
            .find((l) => l.includes('nodeId')),
        30_000,
      ).catch((e: unknown) => {
        throw new Error(`${String(e)}: ${JSON.stringify(run.output())}`)
      })
      const started = JSON.parse(line) as { nodeId: string; url: string; epoch: number }
      expect(started).toMatchObject({ epoch: 1, url: expect.stringMatching(/^https:\/\/127\.0\.0\.1:\d+$/) })
      const store = new NodeStore(db)
      expect(await store.get(started.nodeId)).toMatchObject({
        name: 'cli-node',
        state: 'ready',
        address: started.url,
      })
      run.child.kill('SIGTERM')
      const done = await run.done
      expect(done.code).toBe(0)
      expect(await store.get(started.nodeId)).toMatchObject({ state: 'stopped' })
    } finally {
      await rm(cliDataDir, { recursive: true, force: true })
    }
  })
})
