import { ServerResponse } from 'node:http'
import { type SseMessage, SseParser } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { packDir, startTestServer, type TestServer } from './helpers/server.js'

const HEARTBEAT_MS = 100

let t: TestServer
/** Writes to an SSE response after its client had gone (seen on Node's own ServerResponse). */
const lateWrites: string[] = []
const originalWrite = ServerResponse.prototype.write

beforeAll(async () => {
  // Observes every response of this process (the server runs in it): a write to a response whose
  // socket is destroyed is a write after the client left.
  ServerResponse.prototype.write = function (this: ServerResponse, ...args: unknown[]) {
    const type = String(this.getHeader('content-type') ?? '')
    if (type.startsWith('text/event-stream') && (this.destroyed || this.writableEnded))
      lateWrites.push(String(args[0]).slice(0, 80))
    return (originalWrite as (...a: unknown[]) => boolean).apply(this, args)
  } as typeof ServerResponse.prototype.write
  t = await startTestServer({ server: { sseHeartbeatMs: HEARTBEAT_MS } })
})

afterAll(async () => {
  ServerResponse.prototype.write = originalWrite
  await t?.close()
})

/** Reads SSE messages from a response (the SDK's parser) until `stop` says so; then hangs up. */
async function readUntil(
  res: Response,
  controller: AbortController,
  stop: (message: SseMessage, seen: SseMessage[]) => boolean,
): Promise<SseMessage[]> {
  const parser = new SseParser()
  const decoder = new TextDecoder()
  const seen: SseMessage[] = []
  const reader = (res.body as ReadableStream<Uint8Array>).getReader()
  try {
    while (true) {
      const chunk = await reader.read()
      if (chunk.done) return seen
      for (const message of parser.push(decoder.decode(chunk.value, { stream: true }))) {
        seen.push(message)
        if (stop(message, seen)) return seen
      }
    }
  } finally {
    controller.abort()
  }
}

/** Deploys a project whose build's setup sleeps, without waiting: its log stream stays idle. */
async function deploySlowBuild(name: string): Promise<string> {
  const project = await makeProject({
    'cairn.yaml': `name: ${name}\ncommand: bash agent.sh\nsetup: bash setup.sh\n`,
    // Long enough that the log is followed before the build ends, even on a loaded machine.
    'setup.sh': 'echo setup-started\nsleep 6\necho setup-done\n',
    'agent.sh': 'while read -r l; do echo ok; done\n',
  })
  const res = await t.api.call('POST', '/v1/agents', await packDir(project))
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  return res.body.revision.id as string
}

async function waitForBuild(name: string, revision: string): Promise<void> {
  for (let i = 0; i < 600; i++) {
    const res = await t.api.call('GET', `/v1/agents/${name}/revisions/${revision}`)
    if (res.body.status !== 'DEPLOYING') return
    await new Promise((r) => setTimeout(r, 50))
  }
  throw new Error(`revision ${revision} still building`)
}

function followLogs(name: string, revision: string, controller: AbortController) {
  return fetch(`${t.url}/v1/agents/${name}/revisions/${revision}/logs?follow=true`, {
    headers: { authorization: `Bearer ${t.key}` },
    signal: controller.signal,
  })
}

describe('SSE streams (one writer for every streaming route)', () => {
  it('sends heartbeats on an idle build-log stream, then the end', async () => {
    const revision = await deploySlowBuild('slow-heartbeat')
    const controller = new AbortController()
    const res = await followLogs('slow-heartbeat', revision, controller)
    expect(res.headers.get('content-type')).toContain('text/event-stream')
    const seen = await readUntil(res, controller, (m) => m.event === 'end')
    const heartbeats = seen.filter((m) => m.event === 'heartbeat')
    expect(heartbeats.length, JSON.stringify(seen)).toBeGreaterThan(0)
    expect(JSON.parse(heartbeats[0]?.data ?? '{}')).toMatchObject({ type: 'heartbeat' })
    expect(seen.at(-1)?.event).toBe('end')
  })

  it('writes nothing to a build-log stream after its client hung up', async () => {
    const revision = await deploySlowBuild('slow-hangup')
    const controller = new AbortController()
    const res = await followLogs('slow-hangup', revision, controller)
    const seen = await readUntil(res, controller, () => true)
    expect(seen.at(-1)?.event, JSON.stringify(seen)).not.toBe('end')
    // The build goes on logging and ends while nobody listens; heartbeats would fire as well.
    await waitForBuild('slow-hangup', revision)
    await new Promise((r) => setTimeout(r, HEARTBEAT_MS * 3))
    expect(lateWrites).toEqual([])
  })

  it('writes nothing to a run stream after its client hung up, and the turn still completes', async () => {
    const deployed = await t.api.call(
      'POST',
      '/v1/agents?wait=true',
      await packDir(await makeProject(SHELL_PROJECT)),
    )
    expect(deployed.body.revision.status).toBe('READY')
    const session = await t.api.createSession('shell')
    const controller = new AbortController()
    const res = await fetch(`${t.url}/v1/sessions/${session.id}/messages`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'echo before; sleep 1; echo after' }),
      signal: controller.signal,
    })
    await readUntil(res, controller, (m) => m.event === 'message.delta').catch(() => [])
    let turns: { status?: string }[] = []
    for (let i = 0; i < 200; i++) {
      turns = (await t.api.call('GET', `/v1/sessions/${session.id}/turns`)).body.data
      if (turns.length > 0 && turns.every((turn) => turn.status !== 'running')) break
      await new Promise((r) => setTimeout(r, 50))
    }
    expect(turns.at(-1)?.status).toBe('completed')
    await new Promise((r) => setTimeout(r, HEARTBEAT_MS * 3))
    expect(lateWrites).toEqual([])
  })
})
