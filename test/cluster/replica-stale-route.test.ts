import type { RuntimeEvents, RuntimePort } from '@cairn/runtime/port'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { loadClusterTls } from '../../packages/runtime/src/port/remote/cluster-tls.js'
import { RemoteRuntimePort } from '../../packages/runtime/src/port/remote/remote-runtime-port.js'
import { type ApiReplicas, startApiReplicas } from '../helpers/api-replicas.js'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import type { Api } from '../helpers/server.js'

// A turn that races a move: replica two read the session's node and owner epoch and asked that
// node about its agent; then replica one moved the session (the old node, told to delete its copy
// under the new epoch, refuses the old one); then replica two's turn went to the old node under the
// old epoch. The node ran nothing (`stale_epoch`): the turn is opened again on the session's node
// now, and completes there. (It failed the turn `stale_epoch` before.) Replica two reuses a row it
// read for 10 minutes instead of a second, so the window the race needs is the test's to hold open;
// its node connections are the real remote ports, the `agent` answer held until the move is done.

/** A hold on replica two's next `agent(sessionId)` answer, until `release`. */
interface Hold {
  sessionId: string
  reached: () => void
  released: Promise<void>
}
let hold: Hold | undefined

/** The real remote port, its `agent` answer for the held session kept until the hold is released. */
function holdingAgentAnswers(port: RuntimePort): RuntimePort {
  return new Proxy(port, {
    get(target, property) {
      const value = Reflect.get(target, property, target)
      if (property !== 'agent') return typeof value === 'function' ? value.bind(target) : value
      return async (sessionId: string) => {
        const agent = await target.agent(sessionId)
        const held = hold
        if (held?.sessionId === sessionId) {
          hold = undefined
          held.reached()
          await held.released
        }
        return agent
      }
    },
  })
}

let cluster: ApiReplicas
let one: Api
let two: Api
let client: pg.Client

beforeAll(async () => {
  cluster = await startApiReplicas(2, 'stale-route', {
    nodes: 2,
    extras: async (i, clusterDir) => {
      if (i !== 1) return {}
      const tls = await loadClusterTls(clusterDir, 'api')
      return {
        routeCacheMs: 600_000,
        connectNode: (row: { address: string }, events: RuntimeEvents) =>
          holdingAgentAnswers(new RemoteRuntimePort({ url: row.address, tls, events })),
      }
    },
  })
  one = cluster.api(0)
  two = cluster.api(1)
  client = new pg.Client({ connectionString: cluster.databaseUrl })
  await client.connect()
  expect((await one.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
}, 180_000)

afterAll(async () => {
  await client?.end()
  await cluster?.close()
})

async function home(sessionId: string): Promise<{ node: string; epoch: number }> {
  const { rows } = await client.query('SELECT runtime_id, owner_epoch FROM sessions WHERE id = $1', [
    sessionId,
  ])
  return { node: rows[0].runtime_id, epoch: Number(rows[0].owner_epoch) }
}

describe.skipIf(testsRunOnPostgres())('a turn through one replica racing a move through another', () => {
  it('meets the old node under the old epoch (stale_epoch) and is opened again on the new owner, where it completes', async () => {
    const { id } = await one.createSession('shell')
    // Replica two reads the session's node and epoch (kept), and leaves its agent warm there.
    expect((await two.send(id, 'echo first > a.txt')).terminal?.type).toBe('run.completed')
    const before = await home(id)

    let reached = () => {}
    const atAgent = new Promise<void>((resolve) => {
      reached = resolve
    })
    let release = () => {}
    hold = {
      sessionId: id,
      reached,
      released: new Promise<void>((resolve) => {
        release = resolve
      }),
    }
    const turn = two.send(id, 'cat a.txt; echo second > b.txt')
    await atAgent
    const moved = await one.call('POST', `/v1/sessions/${id}/move`, {})
    release()
    expect(moved.status, JSON.stringify(moved.body)).toBe(200)
    const after = await home(id)
    expect(after.node).not.toBe(before.node)
    expect(after.epoch).toBe(before.epoch + 1)

    const result = await turn
    expect(result.terminal?.type, JSON.stringify(result.terminal)).toBe('run.completed')
    expect(result.text).toContain('first')
    // It ran on the new owner: its file is there, read through either replica.
    for (const api of [one, two]) {
      const file = await api.call('GET', `/v1/sessions/${id}/files/content?path=b.txt`)
      expect(file.status).toBe(200)
    }
    expect(await home(id)).toEqual(after)
  })
})
