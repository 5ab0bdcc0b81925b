import http from 'node:http'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

/** The per-tenant heavy-read limit (packages/server/src/workspace/heavy-reads.ts). */
const HEAVY_READS_PER_TENANT = 2

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  const shell = await makeProject(SHELL_PROJECT)
  expect((await t.api.deploy(shell)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

interface Answer {
  status: number
  body: Buffer
  socketPort: number | undefined
}

/** One request over `agent` (so over its one kept-alive socket), read to its end. */
function request(agent: http.Agent, method: string, route: string, body?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      t.url + route,
      {
        method,
        agent,
        headers: { authorization: `Bearer ${t.key}`, 'content-type': 'application/octet-stream' },
      },
      (res) => {
        const chunks: Buffer[] = []
        res.on('data', (chunk: Buffer) => chunks.push(chunk))
        res.once('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            body: Buffer.concat(chunks),
            socketPort: res.socket?.localPort,
          }),
        )
        res.once('error', reject)
      },
    )
    req.once('error', reject)
    req.end(body)
  })
}

describe('file downloads over one keep-alive connection', () => {
  it('release their heavy-read slot once answered: sequential downloads beyond the limit all answer 200', async () => {
    const session = await t.api.createSession('shell')
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    try {
      const route = `/v1/sessions/${session.id}/files/content?path=notes.txt`
      expect((await request(agent, 'PUT', route, 'kept bytes')).status).toBe(200)
      const answers: Answer[] = []
      for (let i = 0; i < HEAVY_READS_PER_TENANT * 3; i++) answers.push(await request(agent, 'GET', route))
      expect(answers.map((a) => [a.status, a.body.toString('utf8')])).toEqual(
        answers.map(() => [200, 'kept bytes']),
      )
      // All of them went over the same connection.
      expect(new Set(answers.map((a) => a.socketPort)).size).toBe(1)
    } finally {
      agent.destroy()
    }
  })

  it('leave no connection that holds the server open: a close with an idle keep-alive connection ends', async () => {
    const own = await startTestServer()
    let closed = false
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    try {
      const shell = await makeProject(SHELL_PROJECT)
      expect((await own.api.deploy(shell)).status).toBe(201)
      const session = await own.api.createSession('shell')
      const route = `/v1/sessions/${session.id}/files/content?path=notes.txt`
      const call = (method: string, body?: string) =>
        new Promise<number>((resolve, reject) => {
          const req = http.request(
            own.url + route,
            {
              method,
              agent,
              headers: { authorization: `Bearer ${own.key}`, 'content-type': 'application/octet-stream' },
            },
            (res) => {
              res.resume()
              res.once('end', () => resolve(res.statusCode ?? 0))
            },
          )
          req.once('error', reject)
          req.end(body)
        })
      expect(await call('PUT', 'kept bytes')).toBe(200)
      expect(await call('GET')).toBe(200)
      // The connection is idle and kept alive by the agent; the server's close must not wait on it
      // (Fastify's keepAliveTimeout is 72 s; the test's own timeout is far below that).
      const socketClosed = new Promise<void>((resolve) => {
        const sockets = Object.values(agent.freeSockets).flat()
        expect(sockets).toHaveLength(1)
        sockets[0]?.once('close', () => resolve())
      })
      await own.close()
      closed = true
      await socketClosed
    } finally {
      agent.destroy()
      if (!closed) await own.close()
    }
  }, 60_000)
})
