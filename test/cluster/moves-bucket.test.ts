import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { CreateBucketCommand, ListObjectsV2Command } from '@aws-sdk/client-s3'
import { type RunningServer, startServer } from '@cairn/server'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { initClusterTls } from '../../packages/runtime/src/port/remote/cluster-tls.js'
import { type RunningNode, startNode } from '../../packages/server/src/node/start-node.js'
import { nodeDatabaseUrl } from '../helpers/node-role.js'
import { TestPostgres, testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { startObjectStore, type TestObjectStore } from '../helpers/rgw.js'
import { Api } from '../helpers/server.js'

// Moves through the shipping bucket: two in-process nodes shipping to a real S3 (Ceph RGW), an
// API replica in front. The source has shipped the session's snapshots after its turns; the move
// ships the last increment and the target restores from the chain, then carries the chain on.
const ECHO = {
  'cairn.yaml': 'name: echo\ncommand: bash agent.sh\n',
  'agent.sh': 'while IFS= read -r line; do echo "got $line"; echo "$line" >> seen.txt; done\n',
}
const BUCKET = 'cairn-moves'

let postgres: TestPostgres
let store: TestObjectStore
let client: pg.Client
const dirs: string[] = []
const nodes: RunningNode[] = []
let server: RunningServer
let api: Api
const savedEnv = { ...process.env }

async function tempDir(tag: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `cairn-move-bucket-${tag}-`))
  dirs.push(dir)
  return dir
}

async function home(sessionId: string) {
  const { rows } = await client.query(
    'SELECT runtime_id, owner_epoch, shipped_snapshot_id FROM sessions WHERE id = $1',
    [sessionId],
  )
  return {
    node: rows[0].runtime_id as string,
    epoch: Number(rows[0].owner_epoch),
    shipped: rows[0].shipped_snapshot_id as string | null,
  }
}

async function chainLinks(sessionId: string): Promise<number> {
  const listed = await store
    .client()
    .send(new ListObjectsV2Command({ Bucket: BUCKET, Prefix: `sessions/${sessionId}/chain/` }))
  return listed.KeyCount ?? 0
}

async function eventually(check: () => Promise<boolean>, what: string, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

beforeAll(async () => {
  postgres = await TestPostgres.start()
  store = await startObjectStore()
  await store.client().send(new CreateBucketCommand({ Bucket: BUCKET }))
  process.env.AWS_ACCESS_KEY_ID = store.accessKeyId
  process.env.AWS_SECRET_ACCESS_KEY = store.secretAccessKey
  const url = await postgres.createDatabase()
  client = new pg.Client({ connectionString: url })
  await client.connect()
  const clusterDir = await tempDir('tls')
  await initClusterTls(clusterDir)
  for (const name of ['node-a', 'node-b'])
    nodes.push(
      await startNode({
        dataDir: await tempDir(name),
        clusterDir,
        database: await nodeDatabaseUrl(postgres, url, { role: `cairn_node_${name.replaceAll('-', '_')}` }),
        listen: '127.0.0.1:0',
        name,
        poolImageSizeBytes: 1024 * 1024 * 1024,
        logLevel: 'error',
        s3Bucket: BUCKET,
        s3Endpoint: store.endpoint,
      }),
    )
  server = await startServer({
    role: 'api',
    dataDir: await tempDir('api'),
    database: url,
    clusterDir,
    port: 0,
    writeCredentials: false,
    logLevel: 'error',
  })
  api = new Api(server.url, server.adminKey ?? '')
  expect((await api.deploy(await makeProject(ECHO))).status).toBe(201)
}, 600_000)

afterAll(async () => {
  await server?.close()
  for (const node of nodes) await node.close().catch(() => undefined)
  await client?.end()
  await postgres?.stop()
  await store?.stop()
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
  process.env = savedEnv
})

describe.skipIf(testsRunOnPostgres())('moving sessions through the shipping bucket', () => {
  it('ships the last increment, restores it on the target, and the target carries the chain on', async () => {
    const id = (await api.createSession('echo')).id
    for (const prompt of ['one', 'two']) expect((await api.send(id, prompt)).text).toBe(`got ${prompt}\n`)
    // The node ships the snapshots taken after the turns.
    await eventually(async () => (await home(id)).shipped !== null, 'the first shipped link')
    const before = await home(id)
    const source = nodes.find((n) => n.nodeId === before.node) as RunningNode
    const target = nodes.find((n) => n.nodeId !== before.node) as RunningNode
    const digest = await source.port.digest({ sessionId: id })
    const linksBefore = await chainLinks(id)

    const moved = await api.call('POST', `/v1/sessions/${id}/move`, { toNode: target.nodeId })
    expect(moved.status, JSON.stringify(moved.body)).toBe(200)
    expect(moved.body).toMatchObject({
      via: 'bucket',
      fromNode: source.nodeId,
      toNode: target.nodeId,
      digest,
    })
    const after = await home(id)
    expect(after).toMatchObject({ node: target.nodeId, epoch: before.epoch + 1 })
    // The move's last increment is the newest link, the one the target restored from.
    expect(await chainLinks(id)).toBeGreaterThan(linksBefore)
    expect(await target.port.digest({ sessionId: id })).toBe(digest)
    expect(await source.port.hasWorkspace(id)).toBe(false)

    // On the target the session goes on, and so does its chain (shipped by the new owner).
    expect((await api.send(id, 'three')).text).toBe('got three\n')
    await eventually(async () => (await home(id)).shipped !== after.shipped, 'a link shipped by the target')
    const back = await api.call('POST', `/v1/sessions/${id}/move`, { toNode: source.nodeId })
    expect(back.status, JSON.stringify(back.body)).toBe(200)
    expect(back.body.via).toBe('bucket')
    const file = await api.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)
    expect(file.body).toBe('one\ntwo\nthree\n')
    expect((await api.send(id, 'four')).text).toBe('got four\n')
  }, 240_000)
})
