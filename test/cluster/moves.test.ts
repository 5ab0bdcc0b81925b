import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import type { RuntimePort } from '@cairn/runtime/port'
import { type RunningServer, startServer } from '@cairn/server'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { initClusterTls, loadClusterTls } from '../../packages/runtime/src/port/remote/cluster-tls.js'
import { RemoteRuntimePort } from '../../packages/runtime/src/port/remote/remote-runtime-port.js'
import { probeGvisor } from '../../packages/runtime/src/sandbox/gvisor-driver.js'
import { type RunningNode, startNode } from '../../packages/server/src/node/start-node.js'
import { spawnCli } from '../helpers/cli.js'
import { nodeDatabaseUrl } from '../helpers/node-role.js'
import { TestPostgres, testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { Api } from '../helpers/server.js'

// Moving sessions between nodes: `cairn server --role api` in front of two in-process `cairn
// node`s (real PostgreSQL, mutual TLS, each node its own btrfs pool). A drain moves every idle
// session of the node; a message sent during a move waits for it or is refused retryably, never
// served from the wrong workspace; a move to a node that takes no sessions is refused typed.
const ECHO = {
  'cairn.yaml': 'name: echo\ncommand: bash agent.sh\n',
  'agent.sh': 'while IFS= read -r line; do echo "got $line"; echo "$line" >> seen.txt; done\n',
}

/**
 * A `pause: memory` agent under gVisor: a count and a token in its memory, and a background
 * process it started, whose liveness each turn reports.
 */
const LIVE = {
  'cairn.yaml': 'name: live\ncommand: python3 -u agent.py\nisolation: gvisor\npause: memory\n',
  'agent.py': [
    'import os, subprocess',
    "child = subprocess.Popen(['sleep', '100000'])",
    'token = os.urandom(6).hex()',
    'count = 0',
    'while True:',
    '    input()',
    '    count += 1',
    '    alive = child.poll() is None',
    "    print(f'count={count} token={token} child={child.pid} alive={alive}')",
    '',
  ].join('\n'),
}
const gvisor = await probeGvisor()

let postgres: TestPostgres
let client: pg.Client
const dirs: string[] = []
const nodes: RunningNode[] = []
let server: RunningServer
let api: Api
let url = ''
let clusterDir = ''

async function tempDir(tag: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `cairn-move-${tag}-`))
  dirs.push(dir)
  return dir
}

const nodeA = () => nodes[0] as RunningNode
const nodeB = () => nodes[1] as RunningNode
const nodeById = (id: string) => nodes.find((n) => n.nodeId === id) as RunningNode

async function home(sessionId: string): Promise<{ node: string; epoch: number }> {
  const { rows } = await client.query('SELECT runtime_id, owner_epoch FROM sessions WHERE id = $1', [
    sessionId,
  ])
  return { node: rows[0].runtime_id, epoch: Number(rows[0].owner_epoch) }
}

async function digestOf(sessionId: string): Promise<string> {
  const { node } = await home(sessionId)
  return nodeById(node).port.digest({ sessionId })
}

async function nodeAction(node: RunningNode, action: string) {
  const res = await api.call('POST', `/v1/nodes/${node.nodeId}/${action}`)
  expect(res.status, JSON.stringify(res.body)).toBe(200)
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
  const deployed = await api.deploy(await makeProject(ECHO))
  expect(deployed.status, JSON.stringify(deployed.body)).toBe(201)
}, 180_000)

afterAll(async () => {
  await server?.close()
  for (const node of nodes) await node.close().catch(() => undefined)
  await client?.end()
  await postgres?.stop()
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
})

describe.skipIf(testsRunOnPostgres())('moving sessions between nodes', () => {
  it('a drain of a node with 50 idle sessions moves all of them, workspaces and transcripts intact', async () => {
    // Every session on node A: B takes none while cordoned.
    await nodeAction(nodeB(), 'cordon')
    // Placement reads the nodes' rows at most a second old: the cordon counts after that.
    await new Promise((r) => setTimeout(r, 1100))
    const sessions: string[] = []
    for (let i = 0; i < 50; i++) sessions.push((await api.createSession('echo')).id)
    const before = new Map<string, { digest: string; messages: unknown }>()
    for (const [i, id] of sessions.entries()) {
      expect((await home(id)).node).toBe(nodeA().nodeId)
      // A few with a turn (a transcript and a changed workspace), the rest as created.
      if (i % 5 === 0) expect((await api.send(id, `hello ${i}`)).text).toBe(`got hello ${i}\n`)
    }
    for (const id of sessions)
      before.set(id, {
        digest: await digestOf(id),
        messages: (await api.call('GET', `/v1/sessions/${id}/messages`)).body,
      })
    await nodeAction(nodeB(), 'uncordon')
    await nodeAction(nodeA(), 'drain')
    const deadline = Date.now() + 180_000
    for (;;) {
      const list = await api.call('GET', '/v1/nodes')
      const a = (list.body.data as { id: string; sessions: number }[]).find((n) => n.id === nodeA().nodeId)
      if (a?.sessions === 0) break
      expect(Date.now(), `node A still owns ${a?.sessions} sessions`).toBeLessThan(deadline)
      await new Promise((r) => setTimeout(r, 200))
    }
    for (const [i, id] of sessions.entries()) {
      expect(await home(id)).toEqual({ node: nodeB().nodeId, epoch: 1 })
      expect(await digestOf(id)).toBe(before.get(id)?.digest)
      expect((await api.call('GET', `/v1/sessions/${id}/messages`)).body).toEqual(before.get(id)?.messages)
      // The source's copy is gone.
      expect(await nodeA().port.hasWorkspace(id)).toBe(false)
      const events = (await api.call('GET', `/v1/sessions/${id}/events`)).body.data as {
        cause: string
        detail?: string
      }[]
      expect(events.at(-1)?.cause).toBe('moved')
      expect(events.at(-1)?.detail).toContain(`${nodeA().nodeId} → ${nodeB().nodeId}`)
      if (i % 5 === 0) {
        expect((await api.send(id, 'after')).text).toBe('got after\n')
        const file = await api.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)
        expect(file.body).toBe(`hello ${i}\nafter\n`)
      }
    }
    await nodeAction(nodeA(), 'uncordon')
  }, 400_000)

  it('a message sent during a move waits or is refused retryably, never served from the wrong workspace', async () => {
    const id = (await api.createSession('echo')).id
    expect((await api.send(id, 'one')).text).toBe('got one\n')
    const sent: string[] = ['one']
    const allRefused: string[] = []
    for (let round = 0; round < 4; round++) {
      const { node } = await home(id)
      const to = nodes.find((n) => n.nodeId !== node) as RunningNode
      const move = api.call('POST', `/v1/sessions/${id}/move`, { toNode: to.nodeId })
      const refused: string[] = []
      // Messages while the move runs: each is served (before the hold, or after on the new node)
      // or refused with a retryable code; what a served one wrote is in the workspace after.
      for (let i = 0; i < 5; i++) {
        const prompt = `r${round}m${i}`
        const result = await api.send(id, prompt)
        if (result.terminal?.type === 'run.completed') {
          expect(result.text).toBe(`got ${prompt}\n`)
          sent.push(prompt)
        } else {
          expect(['session_moving', 'session_busy'], JSON.stringify(result.body)).toContain(
            result.body?.error?.code,
          )
          expect(result.status).toBe(409)
          refused.push(result.body.error.code)
        }
      }
      // The move waits for a turn it meets; it happens.
      const moved = await move
      expect(moved.status, JSON.stringify(moved.body)).toBe(200)
      expect(moved.body.toNode).toBe(to.nodeId)
      expect(await home(id)).toMatchObject({ node: to.nodeId })
      allRefused.push(...refused)
      const file = await api.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)
      expect(file.body).toBe(`${sent.join('\n')}\n`)
    }
    // Some messages met a move: they were told so (retryable), not served elsewhere.
    expect(allRefused).toContain('session_moving')
    expect((await home(id)).epoch).toBe(4)
  }, 240_000)

  it.skipIf(!gvisor.ok)(
    'a move of a warm pause: memory session carries its memory: its processes go on on the other node',
    async () => {
      expect((await api.deploy(await makeProject(LIVE))).status).toBe(201)
      const id = (await api.createSession('live', { keepWarmMs: 600_000 })).id
      await api.send(id, 'one')
      const before = (await api.send(id, 'two')).text
      const match = /count=2 token=(\w+) child=(\d+) alive=True/.exec(before)
      expect(match, before).not.toBeNull()
      const { node } = await home(id)
      const to = nodes.find((n) => n.nodeId !== node) as RunningNode
      const moved = await api.call('POST', `/v1/sessions/${id}/move`, { toNode: to.nodeId })
      expect(moved.status, JSON.stringify(moved.body)).toBe(200)
      expect(moved.body.memoryBytes).toBeGreaterThan(0)
      const after = await api.send(id, 'three')
      expect(after.text).toBe(`count=3 token=${match?.[1]} child=${match?.[2]} alive=True\n`)
      const started = after.events.find((e) => e.type === 'run.started')
      expect(started?.type === 'run.started' && started.coldStart).toBe(false)
      expect(await home(id)).toMatchObject({ node: to.nodeId })
      // Nothing of it is left on the source: no workspace, no checkpoint.
      const source = nodeById(node)
      expect(await source.port.hasWorkspace(id)).toBe(false)
      expect(await source.port.memoryCheckpointBytes([id])).toEqual([0])
      console.log(
        `[moves] a memory move took ${moved.body.durationMs} ms (${moved.body.memoryBytes} bytes of memory)`,
      )
    },
    120_000,
  )

  it('refuses a move to a cordoned, lost or unknown node, typed, and the session stays', async () => {
    const id = (await api.createSession('echo')).id
    expect((await api.send(id, 'stay')).text).toBe('got stay\n')
    const { node } = await home(id)
    const other = nodes.find((n) => n.nodeId !== node) as RunningNode
    await nodeAction(other, 'cordon')
    const cordoned = await api.call('POST', `/v1/sessions/${id}/move`, { toNode: other.nodeId })
    expect(cordoned.status).toBe(409)
    expect(cordoned.body.error.code).toBe('conflict')
    expect(cordoned.body.error.message).toContain('cordoned')
    // Nowhere to go by placement either: the only other node takes no sessions.
    const placed = await api.call('POST', `/v1/sessions/${id}/move`, {})
    expect(placed.status).toBe(503)
    expect(placed.body.error.code).toBe('node_unavailable')
    await nodeAction(other, 'uncordon')
    // A node the leader declared lost (its row as declareNodeLost leaves it).
    await client.query(
      `INSERT INTO nodes (id, name, address, boot_id, state, drivers, cpus, epoch, lease_expires_at, heartbeat_at, registered_at, lost_at)
       VALUES ('rt_lostmove', 'lost', 'https://127.0.0.1:1', 'b', 'lost', '["bwrap"]', 2, 1, now()::text, now()::text, now()::text, now()::text)`,
    )
    const lost = await api.call('POST', `/v1/sessions/${id}/move`, { toNode: 'rt_lostmove' })
    expect(lost.status).toBe(503)
    expect(lost.body.error.code).toBe('node_lost')
    const unknown = await api.call('POST', `/v1/sessions/${id}/move`, { toNode: 'rt_nosuchnode' })
    expect(unknown.status).toBe(503)
    expect(unknown.body.error.code).toBe('node_unavailable')
    const self = await api.call('POST', `/v1/sessions/${id}/move`, { toNode: node })
    expect(self.status).toBe(409)
    expect(await home(id)).toEqual({ node, epoch: 0 })
    expect((await api.send(id, 'still')).text).toBe('got still\n')
  }, 120_000)

  it('a snapshot taken before a move is refused 409 snapshot_left_behind naming the move, and restores once the session is back on its node', async () => {
    const id = (await api.createSession('echo')).id
    expect((await api.send(id, 'x')).text).toBe('got x\n')
    const snap = await api.call('POST', `/v1/sessions/${id}/snapshots`, { label: 'before the move' })
    expect(snap.status, JSON.stringify(snap.body)).toBe(201)
    expect((await api.send(id, 'y')).text).toBe('got y\n')
    const start = await home(id)
    const moved = await api.call('POST', `/v1/sessions/${id}/move`, {})
    expect(moved.status, JSON.stringify(moved.body)).toBe(200)
    // A move carries the workspace, not the snapshots before it: refused typed, naming the move
    // (it was a bare 404 "gone from the storage pool" while the list still showed the snapshot).
    for (const action of ['restore', 'fork']) {
      const res = await api.call('POST', `/v1/sessions/${id}/${action}`, { snapshotId: snap.body.id })
      expect(res.status, JSON.stringify(res.body)).toBe(409)
      expect(res.body.error.code).toBe('snapshot_left_behind')
      expect(res.body.error.message).toContain(start.node)
      expect(res.body.error.details).toMatchObject({ snapshotId: snap.body.id })
    }
    const kept = await api.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)
    expect(kept.body).toBe('x\ny\n')
    // Back on the node that holds it, the snapshot restores.
    const back = await api.call('POST', `/v1/sessions/${id}/move`, { toNode: start.node })
    expect(back.status, JSON.stringify(back.body)).toBe(200)
    const restored = await api.call('POST', `/v1/sessions/${id}/restore`, { snapshotId: snap.body.id })
    expect(restored.status, JSON.stringify(restored.body)).toBe(200)
    const file = await api.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)
    expect(file.body).toBe('x\n')
  }, 120_000)

  it('moves a session back and forth: same workspace each time, epoch one more per move', async () => {
    const id = (await api.createSession('echo')).id
    expect((await api.send(id, 'x')).text).toBe('got x\n')
    const digest = await digestOf(id)
    const start = await home(id)
    for (let i = 1; i <= 4; i++) {
      const res = await api.call('POST', `/v1/sessions/${id}/move`, {})
      expect(res.status, JSON.stringify(res.body)).toBe(200)
      const now = await home(id)
      expect(now.epoch).toBe(start.epoch + i)
      expect(now.node).toBe(res.body.toNode)
      expect(now.node).not.toBe(res.body.fromNode)
      expect(res.body.digest).toBe(digest)
      // No bucket here: straight from node to node.
      expect(res.body.via).toBe('direct')
      expect(await digestOf(id)).toBe(digest)
    }
    expect((await home(id)).node).toBe(start.node)
    // The CLI: `cairn sessions move ID --to NODE` (by a unique prefix of the ID, as every sessions command).
    const other = nodes.find((n) => n.nodeId !== start.node) as RunningNode
    const env = { CAIRN_API_URL: server.url, CAIRN_API_KEY: server.adminKey ?? '' }
    const cli = await spawnCli(['sessions', 'move', id, '--to', other.nodeId, '--json'], env).done
    expect(cli.code, cli.stderr).toBe(0)
    expect(JSON.parse(cli.stdout)).toMatchObject({
      sessionId: id,
      fromNode: start.node,
      toNode: other.nodeId,
    })
    // rt_lostmove: the lost node's row from the test before.
    const toLost = await spawnCli(['sessions', 'move', id, '--to', 'rt_lostmove'], env).done
    expect(toLost.code).toBe(1)
    expect(toLost.stderr).toMatch(/declared lost/)
    const cliBack = await spawnCli(['sessions', 'move', id], env).done
    expect(cliBack.code, cliBack.stderr).toBe(0)
    expect(cliBack.stdout).toMatch(/moved: .* → .*via direct, owner epoch 6/)
    expect((await home(id)).node).toBe(start.node)
    expect((await api.send(id, 'y')).text).toBe('got y\n')
    const file = await api.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)
    expect(file.body).toBe('x\ny\n')
    // Only the install's admin moves sessions: a read key is forbidden; another tenant's admin
    // does not even see the session (404, as on every ID-taking route).
    for (const [body, status] of [
      [{ role: 'read', name: 'reader' }, 403],
      [{ tenant: 'tnt_movers', name: 'other admin' }, 404],
    ] as const) {
      const key = await api.call('POST', '/v1/keys', body)
      expect(key.status, JSON.stringify(key.body)).toBe(201)
      const res = await new Api(server.url, key.body.key).call('POST', `/v1/sessions/${id}/move`, {})
      expect(res.status).toBe(status)
    }
    expect((await home(id)).epoch).toBe(start.epoch + 6)
  }, 120_000)
  it('a turn through another replica racing a move meets the old node (stale_epoch) and is opened again on the new owner, where it completes', async () => {
    // Replica two read the session's node and epoch and asked that node about its agent; then the
    // first replica moved the session (the old node, told to delete its copy under the new epoch,
    // refuses the old one); then replica two's turn went to the old node under the old epoch. The
    // node ran nothing: the turn is opened again on the new owner. (It failed before, node_lost.)
    // Replica two reuses a row it read for 10 minutes (not a second), so the window the race needs
    // is the test's to hold open; its node ports are the real remote ones, its agent answer held.
    const tls = await loadClusterTls(clusterDir, 'api')
    let held: { sessionId: string; reached: () => void; released: Promise<void> } | undefined
    const holdingAgentAnswers = (port: RuntimePort): RuntimePort =>
      new Proxy(port, {
        get(target, property) {
          const value = Reflect.get(target, property, target)
          if (property !== 'agent') return typeof value === 'function' ? value.bind(target) : value
          return async (sessionId: string) => {
            const agent = await target.agent(sessionId)
            const hold = held
            if (hold?.sessionId === sessionId) {
              held = undefined
              hold.reached()
              await hold.released
            }
            return agent
          }
        },
      })
    const two = await startServer(
      {
        role: 'api',
        dataDir: await tempDir('api-two'),
        database: url,
        clusterDir,
        port: 0,
        logLevel: 'error',
      },
      {
        routeCacheMs: 600_000,
        connectNode: (row, events) =>
          holdingAgentAnswers(new RemoteRuntimePort({ url: row.address, tls, events })),
      },
    )
    try {
      const apiTwo = new Api(two.url, server.adminKey ?? '')
      const { id } = await api.createSession('echo')
      // The first replica leaves the session's agent warm; replica two reads the session's node
      // and epoch (kept). No turn of its own told it of the sandbox: it asks the node at its message.
      expect((await api.send(id, 'first')).text).toBe('got first\n')
      expect((await apiTwo.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)).body).toBe(
        'first\n',
      )
      const before = await home(id)
      let release = () => {}
      const atAgent = new Promise<void>((reached) => {
        held = { sessionId: id, reached, released: new Promise<void>((resolve) => (release = resolve)) }
      })
      const turn = apiTwo.send(id, 'second')
      await atAgent
      const moved = await api.call('POST', `/v1/sessions/${id}/move`, {})
      release()
      expect(moved.status, JSON.stringify(moved.body)).toBe(200)
      const after = await home(id)
      expect(after).toEqual({
        node: nodes.find((n) => n.nodeId !== before.node)?.nodeId,
        epoch: before.epoch + 1,
      })
      const result = await turn
      expect(result.terminal?.type, JSON.stringify(result.terminal)).toBe('run.completed')
      expect(result.text).toBe('got second\n')
      // It ran on the new owner, on the moved workspace: read through either replica.
      for (const through of [api, apiTwo]) {
        const file = await through.call('GET', `/v1/sessions/${id}/files/content?path=seen.txt`)
        expect(file.body).toBe('first\nsecond\n')
      }
      expect(await home(id)).toEqual(after)
    } finally {
      await two.close()
    }
  })
})
