import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type ApiReplicas, startApiReplicas } from '../helpers/api-replicas.js'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { deltaText, idsOf, readEvents } from '../helpers/sse.js'

// A run streamed by one API replica, whose client's connection dropped, is picked up through
// another replica (the load balancer sent the reconnect elsewhere): the second replica shares only
// the database with the first, and streams exactly the events missed, then the live ones.
let cluster: ApiReplicas

beforeAll(async () => {
  cluster = await startApiReplicas(2, 'replica-stream-resume')
  expect((await cluster.api(0).deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
}, 180_000)

afterAll(async () => {
  await cluster?.close()
})

const SLOW = 'for i in 1 2 3 4 5 6; do echo line-$i; sleep 0.4; done'

describe.skipIf(testsRunOnPostgres())('a run stream resumed through another API replica', () => {
  it('gets exactly the events missed, then the live ones until the turn ends; then a reconnect gets 204', async () => {
    const one = cluster.api(0)
    const two = cluster.api(1)
    const { id } = await one.createSession('shell')
    const controller = new AbortController()
    const res = await fetch(`${one.url}/v1/sessions/${id}/messages`, {
      method: 'POST',
      headers: { authorization: `Bearer ${one.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: SLOW }),
      signal: controller.signal,
    })
    expect(res.status).toBe(200)
    const turnId = res.headers.get('cairn-turn-id') ?? ''
    const { messages: before } = await readEvents(res, controller, (m) => m.event === 'message.delta')
    const resumeAt = (headers: Record<string, string>) =>
      fetch(`${two.url}/v1/sessions/${id}/turns/${turnId}/events`, {
        headers: { authorization: `Bearer ${two.key}`, ...headers },
      })
    const resumed = await resumeAt({ 'last-event-id': before.at(-1)?.id ?? '' })
    expect(resumed.status).toBe(200)
    // The turn still runs on the first replica while the second streams it.
    const running = await two.call('GET', `/v1/sessions/${id}/turns`)
    expect(running.body.data.at(-1).status).toBe('running')
    const { messages: after, ended } = await readEvents(resumed)
    expect(ended).toBe(true)
    const all = [...before, ...after]
    expect(idsOf(all)).toEqual(all.map((_, i) => i + 1))
    expect(after.at(-1)?.event).toBe('run.completed')
    const text = (JSON.parse(after.at(-1)?.data ?? '{}') as { text: string }).text
    expect(deltaText(all)).toBe(text)
    expect(text).toContain('line-6')
    const done = await resumeAt({ 'last-event-id': after.at(-1)?.id ?? '' })
    expect(done.status).toBe(204)
  })
})
