import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  LATEST_PROTOCOL_VERSION,
  ProgressNotificationSchema,
  SUPPORTED_PROTOCOL_VERSIONS,
} from '@modelcontextprotocol/sdk/types.js'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, CLI_BIN } from './helpers/cli.js'
import { EXAMPLES, startTestServer, type TestServer } from './helpers/server.js'

// The MCP server at /v1/mcp, driven by the official TypeScript client (the SDK's Client with its
// Streamable HTTP transport, and its stdio transport for `cairn mcp`) against a real server, one
// for the file. Bad input and other tenants: test/security/mcp.test.ts.

let t: TestServer
let client: Client
let transport: StreamableHTTPClientTransport

function httpTransport(key: string): StreamableHTTPClientTransport {
  return new StreamableHTTPClientTransport(new URL(`${t.url}/v1/mcp`), {
    requestInit: { headers: { authorization: `Bearer ${key}` } },
  })
}

/** A tool's structured result; a tool error fails the test with its body. */
async function call(mcp: Client, name: string, args: Record<string, unknown> = {}) {
  const result = await mcp.callTool({ name, arguments: args })
  if (result.isError) throw new Error(`${name} failed: ${JSON.stringify(result.structuredContent)}`)
  // biome-ignore lint/suspicious/noExplicitAny: test convenience
  return result.structuredContent as any
}

beforeAll(async () => {
  assertBuilt()
  t = await startTestServer()
  expect((await t.api.deploy(`${EXAMPLES}/notes`)).status).toBe(201)
  client = new Client({ name: 'cairn-test', version: '1.0.0' })
  transport = httpTransport(t.key)
  await client.connect(transport)
})

afterAll(async () => {
  await client?.close()
  await t?.close()
})

describe('MCP over Streamable HTTP', () => {
  it("negotiates the SDK client's latest revision and answers each revision it supports", async () => {
    expect(transport.protocolVersion).toBe(LATEST_PROTOCOL_VERSION)
    for (const version of SUPPORTED_PROTOCOL_VERSIONS) {
      const res = await fetch(`${t.url}/v1/mcp`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${t.key}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
        },
        body: JSON.stringify({
          jsonrpc: '2.0',
          id: 1,
          method: 'initialize',
          params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
        }),
      })
      const data = /^data: (.*)$/m.exec(await res.text())?.[1] ?? '{}'
      expect(JSON.parse(data).result?.protocolVersion, version).toBe(version)
    }
    const { tools } = await client.listTools()
    const send = tools.find((tool) => tool.name === 'send_message')
    expect(send?.inputSchema.required).toEqual(['sessionId', 'prompt'])
  })

  it('keeps the workspace across the turns of a conversation; the reply streams as progress', async () => {
    const session = await call(client, 'create_session', { agent: 'notes' })
    const progress: string[] = []
    const first = await client.callTool(
      { name: 'send_message', arguments: { sessionId: session.id, prompt: 'The boat is named Tern' } },
      undefined,
      { onprogress: (p) => progress.push(String(p.message)) },
    )
    expect(first.isError).toBeFalsy()
    expect(progress.join('')).toContain('Noted: The boat is named Tern')
    const second = await call(client, 'send_message', {
      sessionId: session.id,
      prompt: 'What is the boat named?',
    })
    expect(second).toMatchObject({ status: 'completed', sessionId: session.id })
    expect(second.text).toContain('The boat is named Tern')
    // The transcript and the workspace, as resources.
    const transcript = await client.readResource({ uri: `cairn://sessions/${session.id}/transcript` })
    const messages = JSON.parse(String(transcript.contents[0]?.text)).data
    expect(messages.map((m: { role: string }) => m.role)).toEqual(['user', 'assistant', 'user', 'assistant'])
    const notes = await client.readResource({ uri: `cairn://sessions/${session.id}/files/notes.md` })
    expect(notes.contents[0]?.text).toBe('- The boat is named Tern\n')
    const listed = await client.listResources()
    expect(listed.resources.map((r) => r.uri)).toContain(`cairn://sessions/${session.id}/transcript`)
  })

  it('writes, diffs, snapshots, restores and forks the workspace through the native services', async () => {
    const { id } = await call(client, 'create_session', { agent: 'notes' })
    await call(client, 'write_file', { sessionId: id, path: 'plan/a.txt', content: 'one' })
    expect((await call(client, 'diff', { sessionId: id })).added).toContain('plan/a.txt')
    const snap = await call(client, 'snapshot', { sessionId: id, label: 'one' })
    await call(client, 'write_file', {
      sessionId: id,
      path: 'plan/a.txt',
      content: '//4A',
      encoding: 'base64',
    })
    expect(await call(client, 'read_file', { sessionId: id, path: 'plan/a.txt' })).toMatchObject({
      encoding: 'base64',
      content: '//4A',
    })
    expect(
      (await call(client, 'list_snapshots', { sessionId: id })).data.map((s: { id: string }) => s.id),
    ).toContain(snap.id)
    await call(client, 'restore', { sessionId: id, snapshotId: snap.id })
    expect((await call(client, 'read_file', { sessionId: id, path: 'plan/a.txt' })).content).toBe('one')
    const fork = await call(client, 'fork', { sessionId: id, snapshotId: snap.id, title: 'the fork' })
    const files = await call(client, 'list_files', { sessionId: fork.id, path: 'plan' })
    expect(files.data.map((f: { name: string }) => f.name)).toEqual(['a.txt'])
    expect((await call(client, 'end_session', { sessionId: id })).status).toBe('completed')
    expect((await call(client, 'resume_session', { sessionId: id })).status).toBe('idle')
    const own = await call(client, 'list_sessions', { limit: 500 })
    expect(own.data.map((s: { id: string }) => s.id)).toEqual(expect.arrayContaining([id, fork.id]))
    expect((await call(client, 'list_agents')).data.map((a: { name: string }) => a.name)).toEqual(['notes'])
  })
})

describe('run_command', () => {
  it('runs a command in the session beside its turns: same workspace, output as progress, exit status', async () => {
    const { id } = await call(client, 'create_session', { agent: 'notes' })
    const progress: string[] = []
    const ran = await client.callTool(
      {
        name: 'run_command',
        arguments: {
          sessionId: id,
          command: ['sh', '-c', 'echo "- The kite is red" >> notes.md; echo wrote; echo oops >&2; exit 3'],
        },
      },
      undefined,
      { onprogress: (p) => progress.push(String(p.message)) },
    )
    expect(ran.structuredContent).toMatchObject({
      command: { status: 'exited', exitCode: 3 },
      stdout: 'wrote\n',
      stderr: 'oops\n',
    })
    expect(progress.join('')).toContain('wrote')
    const asked = await call(client, 'send_message', { sessionId: id, prompt: 'What colour is the kite?' })
    expect(asked.text).toContain('The kite is red')
  })
})

describe('cairn mcp (stdio)', () => {
  it('serves the same tools over stdio, proxied to the server with the CLI’s key', async () => {
    const stdio = new Client({ name: 'cairn-test-stdio', version: '1.0.0' })
    await stdio.connect(
      new StdioClientTransport({
        command: process.execPath,
        args: [CLI_BIN, 'mcp'],
        env: { PATH: process.env.PATH ?? '', CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, NO_COLOR: '1' },
        stderr: 'pipe',
      }),
    )
    try {
      const [viaStdio, viaHttp] = await Promise.all([stdio.listTools(), client.listTools()])
      expect(viaStdio.tools).toEqual(viaHttp.tools)
      const { id } = await call(stdio, 'create_session', { agent: 'notes' })
      // Progress read by a handler of our own: the SDK client's `onprogress` drops a notification
      // that reaches it in the same read from the pipe as the result (its notification handlers run
      // a microtask later than its response handler), which a fast turn over stdio makes likely.
      const progress: string[] = []
      stdio.setNotificationHandler(ProgressNotificationSchema, ({ params }) => {
        if (params.progressToken === 'kestrel') progress.push(String(params.message))
      })
      const said = await stdio.callTool({
        name: 'send_message',
        arguments: { sessionId: id, prompt: 'Kestrels hover' },
        _meta: { progressToken: 'kestrel' },
      })
      await expect.poll(() => progress.join('')).toContain('Noted: Kestrels hover')
      expect(said.structuredContent).toMatchObject({ status: 'completed' })
      const bad = await stdio.callTool({ name: 'read_file', arguments: { sessionId: id, path: 7 } })
      expect(bad.isError).toBe(true)
      expect(bad.structuredContent).toMatchObject({ error: { code: 'validation_failed' } })
    } finally {
      await stdio.close()
    }
  })
})
