import { type ChildProcess, execFile, spawn } from 'node:child_process'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import { CreateBucketCommand } from '@aws-sdk/client-s3'
import { type RunningServer, startServer } from '@cairn/server'
import pg from 'pg'
import { expect } from 'vitest'
import { initClusterTls, loadClusterTls } from '../../packages/runtime/src/port/remote/cluster-tls.js'
import { RemoteRuntimePort } from '../../packages/runtime/src/port/remote/remote-runtime-port.js'
import { createShippingBucket, type ShippingBucket } from '../../packages/runtime/src/shipping/index.js'
import { unownedPoolTrees } from '../../packages/runtime/src/storage/btrfs-pool.js'
import type { StartServerExtras } from '../../packages/server/src/api-role.js'
import { DEFAULT_TENANT_QUOTA_MIB } from '../../packages/server/src/config.js'
import { CAIRN_CLI } from './cluster.js'
import { nodeDatabaseUrl } from './node-role.js'
import { postgresBinDir, TestPostgres } from './postgres.js'
import { makeProject } from './projects.js'
import { startObjectStore, type TestObjectStore } from './rgw.js'
import { Api } from './server.js'

// The test bed of test/cluster/recover.test.ts, its state read by the tests (live bindings):
// step 3 of the cluster, end to end: real `cairn node` processes (killed with SIGKILL), an API
// replica in this process, PostgreSQL, and a real S3 server (Ceph RGW) as the shipping bucket.
export const BUCKET = 'cairn-recover'
/** The bed's heartbeat and lease: the nodes' (`--heartbeat-ms`, `--lease-ms`) and the replicas'. */
const TIMING = { heartbeatMs: 500, leaseMs: 2000 }
const WRITER = {
  'cairn.yaml': 'name: writer\ncommand: bash agent.sh\n',
  'agent.sh': 'while IFS= read -r line; do echo "$line" >> seen.txt; echo "got $line"; done\n',
}

export let postgres: TestPostgres
export let store: TestObjectStore
export let url = ''
export let client: pg.Client
export let clusterDir = ''
export let bucket: ShippingBucket
const dirs: string[] = []
export let server: RunningServer
export let api: Api
export let apiDataDir = ''

export interface NodeProcess {
  name: string
  dataDir: string
  child: ChildProcess
  id: string
  log: string[]
}
export const running = new Map<string, NodeProcess>()
/** Nodes killed and not started again: started once more at the end, which reaps their sandboxes. */
export const killed = new Map<string, NodeProcess>()

export async function tempDir(tag: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `cairn-recover-${tag}-`))
  dirs.push(dir)
  return dir
}

export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined>,
  timeoutMs = 60_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value !== undefined) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
}

/** Starts `cairn node` as its own process (a second start on the same data dir is the node coming back). */
export async function startNodeProcess(name: string, dataDir: string): Promise<NodeProcess> {
  const child = spawn(
    process.execPath,
    [
      CAIRN_CLI,
      'node',
      '--database',
      await nodeDatabaseUrl(postgres, url, { role: `cairn_node_${name.replaceAll('-', '_')}` }),
      '--cluster-dir',
      clusterDir,
      '--listen',
      '127.0.0.1:0',
      '--name',
      name,
      '--data-dir',
      dataDir,
      '--heartbeat-ms',
      String(TIMING.heartbeatMs),
      '--lease-ms',
      String(TIMING.leaseMs),
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
  killed.delete(name)
  return node
}

/**
 * The trees of the node's pool without a limited owner (`unownedPoolTrees`): its pool is the
 * btrfs mount of its data dir's `pool.img`, as the node's process sees its mounts, under the
 * default tenant quota the bed's nodes run with.
 */
export async function nodeUnownedTrees(node: NodeProcess): Promise<string[]> {
  const { stdout } = await promisify(execFile)('losetup', ['-j', path.join(node.dataDir, 'pool.img')])
  const loop = stdout.split(':')[0]
  const mounts = await readFile(`/proc/${node.child.pid}/mounts`, 'utf8')
  const mountPoint = mounts
    .split('\n')
    .map((line) => line.split(' '))
    .find(([source, , type]) => source === loop && type === 'btrfs')?.[1]
  if (!loop || !mountPoint) throw new Error(`the pool of node ${node.name} is not mounted`)
  return unownedPoolTrees(mountPoint, DEFAULT_TENANT_QUOTA_MIB * 1024 * 1024)
}

/** SIGKILL: no deregistration, no flush; its sandboxes are reaped when it starts again. */
export async function kill9(node: NodeProcess): Promise<void> {
  const exited = new Promise((resolve) => node.child.once('exit', resolve))
  node.child.kill('SIGKILL')
  await exited
  running.delete(node.name)
  killed.set(node.name, node)
}

export async function stopNode(node: NodeProcess): Promise<void> {
  const exited = new Promise((resolve) => node.child.once('exit', resolve))
  node.child.kill('SIGTERM')
  await exited
  running.delete(node.name)
}

export async function nodeState(id: string): Promise<string> {
  const { rows } = await client.query('SELECT state FROM nodes WHERE id = $1', [id])
  return rows[0]?.state as string
}

export async function sessionRow(id: string) {
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

/**
 * Waits until the snapshot taken after the session's last turn (it is taken in the background
 * once the turn ends) is recorded as shipped (the bucket confirmed it); returns its ID.
 */
export async function shippedNewest(sessionId: string, timeoutMs = 60_000): Promise<string> {
  return waitFor(
    `session ${sessionId} to ship the snapshot after its last turn`,
    async () => {
      const { rows } = await client.query(
        `SELECT s.shipped_snapshot_id AS shipped, n.id AS newest FROM sessions s
           JOIN snapshots n ON n.session_id = s.id AND n.deleted_at IS NULL
             AND COALESCE(n.through_turn_seq, n.turn_seq) = (SELECT max(seq) FROM turns WHERE session_id = s.id)
          WHERE s.id = $1`,
        [sessionId],
      )
      const found = rows.find((r) => r.shipped === r.newest)
      return found ? (found.newest as string) : undefined
    },
    timeoutMs,
  )
}

export async function nodePort(nodeId: string): Promise<RemoteRuntimePort> {
  const { rows } = await client.query('SELECT address FROM nodes WHERE id = $1', [nodeId])
  return new RemoteRuntimePort({
    url: rows[0].address as string,
    tls: await loadClusterTls(clusterDir, 'api'),
  })
}

export async function events(sessionId: string, cause: string) {
  const { rows } = await client.query(
    'SELECT detail FROM session_events WHERE session_id = $1 AND cause = $2 ORDER BY at',
    [sessionId, cause],
  )
  return rows.map((r) => r.detail as string)
}

export async function turnIds(sessionId: string): Promise<{ id: string; seq: number }[]> {
  const { rows } = await client.query('SELECT id, seq FROM turns WHERE session_id = $1 ORDER BY seq', [
    sessionId,
  ])
  return rows.map((r) => ({ id: r.id as string, seq: Number(r.seq) }))
}

/**
 * A new session of `agent` and the running node it was placed on (wherever placement put it: the
 * nodes' loads differ after the tests before), with the other running node.
 */
export async function placedSession(
  agent: string,
): Promise<{ id: string; home: NodeProcess; other: NodeProcess }> {
  const id = (await api.createSession(agent)).id
  const nodeId = (await sessionRow(id)).runtime_id
  const home = [...running.values()].find((n) => n.id === nodeId)
  const other = [...running.values()].find((n) => n.id !== nodeId)
  if (!home || !other) throw new Error(`session ${id} is on ${nodeId}, not on one of two running nodes`)
  return { id, home, other }
}

export async function readSeen(sessionId: string) {
  return api.call('GET', `/v1/sessions/${sessionId}/files/content?path=seen.txt`)
}

/** Starts the bed: PostgreSQL, the bucket, the cluster's certificates, the API replica, two nodes, the writer agent. */
export async function setUpBed(): Promise<void> {
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
  apiDataDir = await tempDir('api')
  server = await startApi(apiDataDir)
  api = new Api(server.url, server.adminKey ?? '')
  for (const name of ['node-a', 'node-b']) await startNodeProcess(name, await tempDir(name))
  expect((await api.deploy(await makeProject(WRITER))).status).toBe(201)
}

/** Stops everything, a killed node started once more first (which reaps its sandboxes). */
export async function tearDownBed(): Promise<void> {
  for (const node of [...killed.values()])
    await startNodeProcess(node.name, node.dataDir).catch(() => undefined)
  await server?.close()
  for (const node of [...running.values()]) await stopNode(node).catch(() => undefined)
  await client?.end()
  await postgres?.stop()
  await store?.stop()
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
}

/** An API replica of the bed's cluster on `dataDir` (its lease timing as the nodes'). */
export async function startApi(dataDir: string, extras: StartServerExtras = {}): Promise<RunningServer> {
  const options = { role: 'api', database: url, clusterDir, dataDir, logLevel: 'error', port: 0 } as const
  return startServer({ ...options, writeCredentials: false, ...TIMING }, extras)
}

/**
 * New machines after a lost machine room: a new database restored from `dumpFile` (pg_dump's
 * custom format), the same bucket and cluster CA, and a new API replica answering `adminKey`.
 */
export async function restoreInstall(dumpFile: string, adminKey: string): Promise<void> {
  const run = promisify(execFile)
  url = await postgres.createDatabase()
  await run(path.join(postgresBinDir(), 'pg_restore'), ['--no-owner', `--dbname=${url}`, dumpFile])
  client = new pg.Client({ connectionString: url })
  await client.connect()
  server = await startApi(await tempDir('api-restored'))
  api = new Api(server.url, adminKey)
}
