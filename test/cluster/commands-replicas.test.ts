import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type ApiReplicas, startApiReplicas } from '../helpers/api-replicas.js'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { readEvents } from '../helpers/sse.js'

// A command started through one API replica, on a runtime node reached over the remote port, is
// picked up through another replica by offset (the load balancer sent the reconnect elsewhere):
// the replicas share only the database; the output is the node's, read by offset from either.
let cluster: ApiReplicas

beforeAll(async () => {
  cluster = await startApiReplicas(2, 'commands-replicas')
  expect((await cluster.api(0).deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
}, 180_000)

afterAll(async () => {
  await cluster?.close()
})

/** The bytes of one stream's `output` events (the two streams' order between pipes is the node's). */
const bytesOf = (messages: { event?: string | undefined; data: string }[], stream: string) =>
  Buffer.concat(
    messages
      .filter((m) => m.event === 'output' && JSON.parse(m.data).stream === stream)
      .map((m) => Buffer.from(JSON.parse(m.data).data, 'base64')),
  )

describe.skipIf(testsRunOnPostgres())('a command through two API replicas and a remote node', () => {
  it('reattaches through the other replica by offset, takes stdin there, and ends the same for both', async () => {
    const one = cluster.api(0)
    const two = cluster.api(1)
    const { id } = await one.createSession('shell')
    const started = await one.call('POST', `/v1/sessions/${id}/commands`, {
      command: ['sh', '-c', 'seq 1 2000; echo half; read x; seq 2001 4000; echo "got $x" >&2; exit 5'],
      stdin: true,
    })
    expect(started.status, JSON.stringify(started.body)).toBe(201)
    const command = started.body.id as string
    const outputAt = (api: typeof one, offset: number, controller?: AbortController) =>
      fetch(`${api.url}/v1/sessions/${id}/commands/${command}/output?offset=${offset}`, {
        headers: { authorization: `Bearer ${api.key}` },
        ...(controller ? { signal: controller.signal } : {}),
      })
    const controller = new AbortController()
    let seen = ''
    const first = await readEvents(await outputAt(one, 0, controller), controller, (m) => {
      if (m.event === 'output') seen += Buffer.from(JSON.parse(m.data).data, 'base64').toString()
      return seen.includes('half\n')
    })
    const lastId = Number(first.messages.at(-1)?.id)
    expect(lastId).toBe(Buffer.byteLength(seen))
    // The other replica sees the command running, writes its stdin, and streams the rest.
    expect((await two.call('GET', `/v1/sessions/${id}/commands/${command}`)).body.status).toBe('running')
    expect(
      (await two.call('POST', `/v1/sessions/${id}/commands/${command}/stdin`, { text: 'yes\n' })).status,
    ).toBe(200)
    const second = await readEvents(await outputAt(two, lastId))
    expect(second.ended).toBe(true)
    const all = [...first.messages, ...second.messages]
    const lines = (from: number, to: number) =>
      Array.from({ length: to - from + 1 }, (_, i) => `${i + from}\n`).join('')
    const stdout = `${lines(1, 2000)}half\n${lines(2001, 4000)}`
    expect(bytesOf(all, 'stdout').toString()).toBe(stdout)
    expect(bytesOf(all, 'stderr').toString()).toBe('got yes\n')
    const expected = stdout + 'got yes\n'
    const exit = JSON.parse(second.messages.at(-1)?.data ?? '{}').command
    expect(exit).toMatchObject({ status: 'exited', exitCode: 5 })
    for (const api of [one, two])
      expect((await api.call('GET', `/v1/sessions/${id}/commands/${command}`)).body).toMatchObject({
        status: 'exited',
        exitCode: 5,
        outputBytes: Buffer.byteLength(expected),
      })
  })
})
