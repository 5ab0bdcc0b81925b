import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { type RunningServer, startServer } from '@cairn/server'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { initClusterTls } from '../../packages/runtime/src/port/remote/cluster-tls.js'
import { type RunningNode, startNode } from '../../packages/server/src/node/start-node.js'
import { nodeDatabaseUrl } from '../helpers/node-role.js'
import { TestPostgres, testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { Api } from '../helpers/server.js'

// `cairn server --role api` in front of two `cairn node`s, everything real: PostgreSQL, the
// cluster's certificates, each node's own data dir and btrfs pool, the runtime port over HTTP/2
// with mutual TLS. The API replica reaches the nodes only through it.
const ECHO = {
  'cairn.yaml': 'name: echo\ncommand: bash agent.sh\n',
  'agent.sh': 'while IFS= read -r line; do echo "got $line"; echo "$line" >> seen.txt; done\n',
}

let postgres: TestPostgres
let url = ''
let client: pg.Client
let clusterDir = ''
const dirs: string[] = []
const nodes: RunningNode[] = []
let server: RunningServer
let api: Api

async function tempDir(tag: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `cairn-cluster-routing-${tag}-`))
  dirs.push(dir)
  return dir
}

beforeAll(async () => {
  postgres = await TestPostgres.start()
  url = await postgres.createDatabase()
  client = new pg.Client({ connectionString: url })
  await client.connect()
  clusterDir = await tempDir('tls')
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
}, 180_000)

afterAll(async () => {
  await server?.close()
  for (const node of nodes) await node.close().catch(() => undefined)
  await client?.end()
  await postgres?.stop()
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
})

describe.skipIf(testsRunOnPostgres())('an API replica and two runtime nodes over mutual TLS', () => {
  it('places sessions on both nodes, ships the revision once, and runs every turn on its session’s node', async () => {
    expect((await api.deploy(await makeProject(ECHO))).status).toBe(201)
    const sessions: string[] = []
    for (let i = 0; i < 8; i++) sessions.push((await api.createSession('echo')).id)
    const { rows } = await client.query('SELECT id, runtime_id FROM sessions')
    const homes = new Map(rows.map((r) => [r.id as string, r.runtime_id as string]))
    for (const node of nodes)
      expect([...homes.values()].filter((n) => n === node.nodeId).length).toBeGreaterThanOrEqual(2)
    const holders = await client.query('SELECT runtime_id FROM revision_nodes ORDER BY runtime_id')
    expect(holders.rows.map((r) => r.runtime_id).sort()).toEqual(nodes.map((n) => n.nodeId).sort())
    for (const [i, id] of sessions.entries()) {
      const first = await api.send(id, `hello ${i}`)
      expect(first.terminal?.type, JSON.stringify(first.events)).toBe('run.completed')
      expect(first.text).toBe(`got hello ${i}\n`)
      expect((await api.send(id, 'again')).text).toBe('got again\n')
      const file = await api.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)
      expect(file.body, JSON.stringify(file.body)).toBe(`hello ${i}\nagain\n`)
    }
    // Each turn ran in a sandbox of its session's node: the node's warm agents are its sessions.
    const turns = await client.query(
      `SELECT t.session_id, t.sandbox_id FROM turns t WHERE t.status = 'completed' ORDER BY t.session_id, t.seq`,
    )
    expect(turns.rows).toHaveLength(16)
  }, 240_000)
})
