import { type ChildProcess, spawn } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { CreateBucketCommand } from '@aws-sdk/client-s3'
import { type RunningServer, startServer } from '@cairn/server'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { initClusterTls, loadClusterTls } from '../../packages/runtime/src/port/remote/cluster-tls.js'
import { RemoteRuntimePort } from '../../packages/runtime/src/port/remote/remote-runtime-port.js'
import {
  createShippingBucket,
  readChainHead,
  type ShippingBucket,
} from '../../packages/runtime/src/shipping/index.js'
import { openDatabase } from '../../packages/server/src/db/database.js'
import { recordShipped } from '../../packages/server/src/node/shipped-record.js'
import { CAIRN_CLI } from '../helpers/cluster.js'
import { TestPostgres, testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { startObjectStore, type TestObjectStore } from '../helpers/rgw.js'
import { Api } from '../helpers/server.js'

// Step 3 of the cluster, end to end: real `cairn node` processes (killed with SIGKILL), an API
// replica in this process, PostgreSQL, and a real S3 server (Ceph RGW) as the shipping bucket.
const BUCKET = 'cairn-recover'
const WRITER = {
  'cairn.yaml': 'name: writer\ncommand: bash agent.sh\n',
  'agent.sh': 'while IFS= read -r line; do echo "$line" >> seen.txt; echo "got $line"; done\n',
}

let postgres: TestPostgres
let store: TestObjectStore
let url = ''
let client: pg.Client
let clusterDir = ''
let bucket: ShippingBucket
const dirs: string[] = []
let server: RunningServer
let api: Api

interface NodeProcess {
  name: string
  dataDir: string
  child: ChildProcess
  id: string
  log: string[]
}
const running = new Map<string, NodeProcess>()

async function tempDir(tag: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `cairn-recover-${tag}-`))
  dirs.push(dir)
  return dir
}

async function waitFor<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value !== undefined) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
}

/** Starts `cairn node` as its own process (a second start on the same data dir is the node coming back). */
async function startNodeProcess(name: string, dataDir: string): Promise<NodeProcess> {
  const child = spawn(
    process.execPath,
    [
      CAIRN_CLI,
      'node',
      '--database',
      url,
      '--cluster-dir',
      clusterDir,
      '--listen',
      '127.0.0.1:0',
      '--name',
      name,
      '--data-dir',
      dataDir,
      '--heartbeat-ms',
      '500',
      '--lease-ms',
      '2000',
      '--s3-bucket',
      BUCKET,
      '--s3-endpoint',
      store.endpoint,
      '--log-level',
      'warn',
    ],
    {
      env: {
        ...process.env,
        AWS_ACCESS_KEY_ID: store.accessKeyId,
        AWS_SECRET_ACCESS_KEY: store.secretAccessKey,
        AWS_REGION: 'default',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  )
  const log: string[] = []
  child.stdout?.on('data', (chunk: Buffer) => log.push(chunk.toString()))
  child.stderr?.on('data', (chunk: Buffer) => log.push(chunk.toString()))
  const before = await client.query('SELECT epoch FROM nodes WHERE name = $1', [name])
  const epochBefore = Number(before.rows[0]?.epoch ?? 0)
  const id = await waitFor(
    `node ${name} to register`,
    async () => {
      if (child.exitCode !== null) throw new Error(`node ${name} exited: ${log.join('')}`)
      const { rows } = await client.query(
        "SELECT id FROM nodes WHERE name = $1 AND state = 'ready' AND epoch > $2",
        [name, epochBefore],
      )
      return rows[0]?.id as string | undefined
    },
    120_000,
  )
  const node = { name, dataDir, child, id, log }
  running.set(name, node)
  return node
}

/** SIGKILL: no deregistration, no flush; its sandboxes are reaped when it starts again. */
async function kill9(node: NodeProcess): Promise<void> {
  const exited = new Promise((resolve) => node.child.once('exit', resolve))
  node.child.kill('SIGKILL')
  await exited
  running.delete(node.name)
}

async function stopNode(node: NodeProcess): Promise<void> {
  const exited = new Promise((resolve) => node.child.once('exit', resolve))
  node.child.kill('SIGTERM')
  await exited
  running.delete(node.name)
}

async function nodeState(id: string): Promise<string> {
  const { rows } = await client.query('SELECT state FROM nodes WHERE id = $1', [id])
  return rows[0]?.state as string
}

async function sessionRow(id: string) {
  const { rows } = await client.query(
    'SELECT runtime_id, owner_epoch, generation, shipped_generation, shipped_snapshot_id, status_cause FROM sessions WHERE id = $1',
    [id],
  )
  const row = rows[0]
  return {
    runtime_id: row.runtime_id as string,
    owner_epoch: Number(row.owner_epoch),
    generation: Number(row.generation),
    shipped_generation: row.shipped_generation === null ? null : Number(row.shipped_generation),
    shipped_snapshot_id: row.shipped_snapshot_id as string | null,
    status_cause: row.status_cause as string,
  }
}

/** The session's newest snapshot (the one taken after its last turn). */
async function newestSnapshot(sessionId: string): Promise<string> {
  const { rows } = await client.query(
    'SELECT id FROM snapshots WHERE session_id = $1 AND deleted_at IS NULL ORDER BY created_at DESC, id DESC LIMIT 1',
    [sessionId],
  )
  return rows[0]?.id as string
}

/** Waits until the session's newest snapshot is recorded as shipped (the bucket confirmed it). */
async function shippedNewest(sessionId: string, timeoutMs = 60_000): Promise<string> {
  return waitFor(
    `session ${sessionId} to ship its newest snapshot`,
    async () => {
      const newest = await newestSnapshot(sessionId)
      const row = await sessionRow(sessionId)
      return newest && row.shipped_snapshot_id === newest ? newest : undefined
    },
    timeoutMs,
  )
}

async function nodePort(nodeId: string): Promise<RemoteRuntimePort> {
  const { rows } = await client.query('SELECT address FROM nodes WHERE id = $1', [nodeId])
  return new RemoteRuntimePort({
    url: rows[0].address as string,
    tls: await loadClusterTls(clusterDir, 'api'),
  })
}

async function events(sessionId: string, cause: string) {
  const { rows } = await client.query(
    'SELECT detail FROM session_events WHERE session_id = $1 AND cause = $2 ORDER BY at',
    [sessionId, cause],
  )
  return rows.map((r) => r.detail as string)
}

async function turnIds(sessionId: string): Promise<{ id: string; seq: number }[]> {
  const { rows } = await client.query('SELECT id, seq FROM turns WHERE session_id = $1 ORDER BY seq', [
    sessionId,
  ])
  return rows.map((r) => ({ id: r.id as string, seq: Number(r.seq) }))
}

async function readSeen(sessionId: string) {
  return api.call('GET', `/v1/sessions/${sessionId}/files/content?path=seen.txt`)
}

beforeAll(async () => {
  postgres = await TestPostgres.start()
  url = await postgres.createDatabase()
  client = new pg.Client({ connectionString: url })
  await client.connect()
  store = await startObjectStore()
  await store.client().send(new CreateBucketCommand({ Bucket: BUCKET }))
  process.env.AWS_ACCESS_KEY_ID = store.accessKeyId
  process.env.AWS_SECRET_ACCESS_KEY = store.secretAccessKey
  bucket = createShippingBucket({ bucket: BUCKET, endpoint: store.endpoint, region: 'default' })
  clusterDir = await tempDir('tls')
  await initClusterTls(clusterDir)
  // The API first: it runs the cluster's migrations (a node needs the tables).
  server = await startServer({
    role: 'api',
    dataDir: await tempDir('api'),
    database: url,
    clusterDir,
    port: 0,
    writeCredentials: false,
    logLevel: 'error',
    heartbeatMs: 500,
    leaseMs: 2000,
  })
  api = new Api(server.url, server.adminKey ?? '')
  for (const name of ['node-a', 'node-b']) await startNodeProcess(name, await tempDir(name))
  expect((await api.deploy(await makeProject(WRITER))).status).toBe(201)
}, 300_000)

afterAll(async () => {
  await server?.close()
  for (const node of [...running.values()]) await stopNode(node).catch(() => undefined)
  await client?.end()
  await postgres?.stop()
  await store?.stop()
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
})

describe.skipIf(testsRunOnPostgres())('workspaces outlive their node (shipping bucket, node loss)', () => {
  it('ship → kill -9 the node → next use on another node: the shipped snapshot byte for byte, the lost turn named', async () => {
    const a = running.get('node-a') as NodeProcess
    const b = running.get('node-b') as NodeProcess
    // A session on node a (placement spreads them: make a few, keep one there).
    let sessionId = ''
    for (let i = 0; i < 10 && !sessionId; i++) {
      const id = (await api.createSession('writer')).id
      if ((await sessionRow(id)).runtime_id === a.id) sessionId = id
    }
    expect(sessionId).not.toBe('')
    for (const prompt of ['one', 'two', 'three'])
      expect((await api.send(sessionId, prompt)).text).toBe(`got ${prompt}\n`)
    const shipped = await shippedNewest(sessionId)
    const row = await sessionRow(sessionId)
    const head = await readChainHead(bucket, sessionId)
    // What the database says is shipped is what the bucket holds.
    expect(head?.snapshotId).toBe(shipped)
    expect(head?.generation).toBe(row.shipped_generation)
    const onA = await nodePort(a.id)
    const shippedDigest = await onA.digest({ snapshotId: shipped })
    expect(head?.treeDigest).toBe(shippedDigest)
    onA.close()

    // Turn 4 runs while the bucket is unreachable, so its changes are not shipped; then the node dies.
    store.killGateway()
    expect((await api.send(sessionId, 'four')).text).toBe('got four\n')
    await kill9(a)
    await store.startGateway()
    await waitFor('node a to be declared lost', async () =>
      (await nodeState(a.id)) === 'lost' ? true : undefined,
    )

    // The next use of the session brings it back on node b, from the shipped snapshot.
    const seen = await readSeen(sessionId)
    expect(seen.status, JSON.stringify(seen.body)).toBe(200)
    expect(seen.body).toBe('one\ntwo\nthree\n')
    const moved = await sessionRow(sessionId)
    expect(moved.runtime_id).toBe(b.id)
    expect(moved.owner_epoch).toBe(row.owner_epoch + 2) // + 1 lost, + 1 recovered
    expect(moved.shipped_snapshot_id).toBe(shipped)
    expect(moved.generation).toBe(row.shipped_generation)
    expect(moved.status_cause).toBe('node_recovered')
    const onB = await nodePort(b.id)
    expect(await onB.digest({ snapshotId: shipped })).toBe(shippedDigest)
    onB.close()
    // Never a silent rollback: the event names the snapshot and turn 4, whose changes did not make it.
    const turns = await turnIds(sessionId)
    expect(turns.map((t) => t.seq)).toEqual([1, 2, 3, 4])
    const [detail] = await events(sessionId, 'node_recovered')
    expect(detail).toContain(shipped)
    expect(detail).toContain(`turn 4 (${turns[3]?.id})`)
    expect(detail).not.toContain(`turn 3 (`)
    // The transcript is complete and the session goes on, on node b.
    expect((await api.send(sessionId, 'five')).text).toBe('got five\n')
    expect((await readSeen(sessionId)).body).toBe('one\ntwo\nthree\nfive\n')
    const transcript = await client.query('SELECT prompt FROM turns WHERE session_id = $1 ORDER BY seq', [
      sessionId,
    ])
    expect(transcript.rows.map((r) => r.prompt)).toEqual(['one', 'two', 'three', 'four', 'five'])

    // Node a comes back (same runtime ID): it does not serve the session that moved, and a write
    // it makes at the old epoch changes nothing.
    const back = await startNodeProcess('node-a', a.dataDir)
    expect(back.id).toBe(a.id)
    expect((await api.send(sessionId, 'six')).text).toBe('got six\n')
    expect((await sessionRow(sessionId)).runtime_id).toBe(b.id)
    const db = await openDatabase(url)
    try {
      const stale = await recordShipped(db, a.id, {
        sessionId,
        snapshotId: 'snap_stale',
        generation: 999,
        shippedAt: new Date().toISOString(),
        ownerEpoch: row.owner_epoch,
      })
      expect(stale).toBe(false)
      // Nor does the new owner's write at an epoch it no longer holds.
      expect(
        await recordShipped(db, b.id, {
          sessionId,
          snapshotId: 'snap_stale',
          generation: 999,
          shippedAt: new Date().toISOString(),
          ownerEpoch: row.owner_epoch + 1,
        }),
      ).toBe(false)
    } finally {
      await db.close()
    }
    expect((await sessionRow(sessionId)).shipped_snapshot_id).not.toBe('snap_stale')
  }, 300_000)
})
