import type { StreamEvent } from '@cairn/protocol'
import { Cairn, type ReconnectInfo } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, spawnCli, waitFor } from './helpers/cli.js'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { packDir, startTestServer, type TestServer } from './helpers/server.js'
import { readEvents } from './helpers/sse.js'
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js'

// The SDK and the CLI pick a run's stream up again by themselves when its connection drops (here
// cut by a TCP proxy between them and the server), and say so; every event arrives once.
let t: TestServer
let proxy: TcpProxy

beforeAll(async () => {
  assertBuilt()
  t = await startTestServer()
  proxy = await startTcpProxy(t.url)
  const deployed = await t.api.call(
    'POST',
    '/v1/agents?wait=true',
    await packDir(await makeProject(SHELL_PROJECT)),
  )
  expect(deployed.body.revision.status).toBe('READY')
}, 120_000)

afterAll(async () => {
  await proxy?.close()
  await t?.close()
})

const SLOW = 'for i in 1 2 3 4; do echo line-$i; sleep 0.4; done'
const LINES = 'line-1\nline-2\nline-3\nline-4\n[exit 0]\n'

/** Every event of a turn as the server recorded it. */
async function recorded(sessionId: string, turnId: string): Promise<unknown[]> {
  const res = await fetch(`${t.url}/v1/sessions/${sessionId}/turns/${turnId}/events`, {
    headers: { authorization: `Bearer ${t.key}` },
  })
  return (await readEvents(res)).messages.map((m) => JSON.parse(m.data))
}

describe('a dropped run stream is picked up again', () => {
  it('the SDK reconnects after the last event, says so, and yields every event exactly once', async () => {
    const client = new Cairn({ apiKey: t.key, baseUrl: proxy.url })
    const session = await client.createSession('shell')
    const told: ReconnectInfo[] = []
    const stream = session.stream(SLOW, { onReconnect: (info) => told.push(info) })
    const seen: StreamEvent[] = []
    let dropped = 0
    for await (const event of stream) {
      seen.push(event)
      if (dropped === 0 && event.type === 'message.delta') dropped = proxy.dropAll()
    }
    expect(dropped).toBeGreaterThan(0)
    const result = await stream.result
    expect(result.finishReason).toBe('completed')
    expect(result.text).toBe(LINES)
    expect(told.length).toBeGreaterThan(0)
    expect(told[0]).toMatchObject({ attempt: 1, turnId: result.turnId })
    expect(told[0]?.afterEventId).toBeGreaterThan(0)
    expect(stream.reconnects).toBeGreaterThanOrEqual(1)
    const events = seen.filter((e) => e.type !== 'heartbeat')
    expect(events).toEqual(await recorded(session.id, result.turnId ?? ''))
    expect(events.flatMap((e) => (e.type === 'message.delta' ? [e.content] : [])).join('')).toBe(LINES)
  })

  it('the CLI reconnects, prints a line on stderr, and prints the reply once', async () => {
    const env = { CAIRN_API_URL: proxy.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: t.dataDir }
    const run = spawnCli(['run', 'shell', SLOW, '--single'], env)
    await waitFor(() => run.output().stdout.includes('line-1'), 30_000, 'the first line')
    expect(proxy.dropAll()).toBeGreaterThan(0)
    const r = await run.done
    expect(r.stderr).toContain('Connection lost; picking the turn up again after event')
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout.trim()).toBe(LINES.trim())
  })
})
