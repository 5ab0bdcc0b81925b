import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { CairnCluster, replyDevice, WHERE_AGENT } from '../helpers/cluster-cairn.js'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { Api } from '../helpers/server.js'

// Issue 18 on one machine: three `cairn node` processes, each in its own network namespace with
// its own pool, behind two API replicas on loopback, on one PostgreSQL.
const SESSIONS = 300
const PARALLEL = 6

let cluster: CairnCluster

beforeAll(async () => {
  if (testsRunOnPostgres()) cluster = await CairnCluster.start({ nodes: 3, apis: 2 })
}, 180_000)

afterAll(async () => {
  await cluster?.close()
})

describe.skipIf(!testsRunOnPostgres())('three runtime nodes behind two API replicas', () => {
  it(`places ${SESSIONS} sessions within ±20 % of even, and runs every turn on its session's node`, async () => {
    const apis = cluster.apis.map((a) => new Api(a.url, cluster.key))
    const [one, two] = apis as [Api, Api]
    expect((await one.deploy(await makeProject(WHERE_AGENT))).status).toBe(201)

    // Created through either replica; each message through the other one.
    const ids: string[] = new Array(SESSIONS)
    const replies: string[] = new Array(SESSIONS)
    let next = 0
    await Promise.all(
      Array.from({ length: PARALLEL }, async () => {
        while (next < SESSIONS) {
          const i = next++
          const session = await (i % 2 ? two : one).createSession('where', { keepWarmMs: 0 })
          ids[i] = session.id
          const turn = await (i % 2 ? one : two).send(session.id, `message ${i}`)
          expect(turn.terminal?.type, JSON.stringify(turn.terminal ?? turn.body)).toBe('run.completed')
          replies[i] = turn.text
        }
      }),
    )

    const devices = await cluster.poolDevices()
    const sessions = await cluster.query<{ id: string; runtime_id: string }>(
      'SELECT id, runtime_id FROM sessions',
    )
    const runtimeOf = new Map(sessions.map((s) => [s.id, s.runtime_id]))
    const perNode = new Map<string, number>()
    for (const [i, id] of ids.entries()) {
      const owner = cluster.nodeById(runtimeOf.get(id) as string)
      // The reply names the pool the workspace is on: the turn ran on the session's node.
      const ranOn = devices.get(replyDevice(replies[i] as string) as string)
      expect(replies[i]).toMatch(new RegExp(`^message ${i} @/dev/loop\\d+\\n$`))
      expect(ranOn?.name, `session ${id}`).toBe(owner.name)
      perNode.set(owner.name, (perNode.get(owner.name) ?? 0) + 1)
    }
    console.log(`[cluster] sessions per node: ${JSON.stringify(Object.fromEntries(perNode))}`)
    expect([...perNode.keys()].sort()).toEqual(['n1', 'n2', 'n3'])
    for (const count of perNode.values()) {
      expect(count).toBeGreaterThanOrEqual(Math.floor((SESSIONS / 3) * 0.8))
      expect(count).toBeLessThanOrEqual(Math.ceil((SESSIONS / 3) * 1.2))
    }

    // From the database: one turn per session, completed.
    const turns = await cluster.query<{ session_id: string; status: string }>(
      'SELECT session_id, status FROM turns',
    )
    expect(turns).toHaveLength(SESSIONS)
    expect(turns.filter((t) => t.status !== 'completed')).toEqual([])
    expect(new Set(turns.map((t) => t.session_id)).size).toBe(SESSIONS)

    // A second turn on a session (sticky): the same node, whichever replica is asked.
    for (const i of [0, 1, 2, 3]) {
      const again = await apis[(i + 1) % 2]?.send(ids[i] as string, `again ${i}`)
      expect(again?.terminal?.type).toBe('run.completed')
      expect(replyDevice(again?.text ?? '')).toBe(replyDevice(replies[i] as string))
    }
  }, 240_000)
})
