import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { CallToolResult, Tool } from '@modelcontextprotocol/sdk/types.js'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { EXAMPLES, startTestServer, type TestServer } from '../helpers/server.js'

// The walls of the MCP server (/v1/mcp), tried with the official client: a tool call reaches only
// its key's tenant, a read-only key changes nothing, and a wrong argument is refused naming the
// field before anything is done. Every tool the server lists is swept, so a new tool is too.

let t: TestServer
let owner: Client
let tenantB: Client
let readOnly: Client
let tools: Tool[]
let sessionId = ''
let snapshotId = ''

async function connect(key: string): Promise<Client> {
  const mcp = new Client({ name: 'cairn-security', version: '1.0.0' })
  await mcp.connect(
    new StreamableHTTPClientTransport(new URL(`${t.url}/v1/mcp`), {
      requestInit: { headers: { authorization: `Bearer ${key}` } },
    }),
  )
  return mcp
}

/** Valid arguments for a tool aimed at tenant A's session: each required field, and a snapshot for restore and fork. */
function argsFor(tool: Tool): Record<string, unknown> {
  const valid: Record<string, unknown> = {
    sessionId,
    agent: 'notes',
    prompt: 'tenant B was here',
    path: 'notes.md',
    content: 'overwritten',
    snapshotId,
    command: ['sh', '-c', 'echo tenant B was here > notes.md'],
  }
  const required = new Set(tool.inputSchema.required ?? [])
  if (tool.name === 'restore' || tool.name === 'fork') required.add('snapshotId')
  return Object.fromEntries([...required].map((key) => [key, valid[key]]))
}

/** The error body of a tool's refusal (the registry's shape); fails when the call succeeded. */
function refusal(result: CallToolResult, what: string): { code: string; message: string } {
  expect(result.isError, `${what}: ${JSON.stringify(result.structuredContent)}`).toBe(true)
  return (result.structuredContent as { error: { code: string; message: string } }).error
}

/** What tenant A has: the state no refused call may change. */
async function tenantAState() {
  const [session, snapshots, files, sessions] = await Promise.all([
    t.api.call('GET', `/v1/sessions/${sessionId}`),
    t.api.call('GET', `/v1/sessions/${sessionId}/snapshots`),
    t.api.call('GET', `/v1/sessions/${sessionId}/files/content?path=notes.md`),
    t.api.call('GET', '/v1/sessions?limit=500'),
  ])
  const { status, turnCount, generation, policy, title } = session.body
  return {
    status,
    turnCount,
    generation,
    policy,
    title,
    snapshots: snapshots.body.data.length,
    notes: files.body,
    sessions: sessions.body.data.length,
  }
}

beforeAll(async () => {
  t = await startTestServer({ server: { rateLimitPerSecond: 0 } })
  expect((await t.api.deploy(`${EXAMPLES}/notes`)).status).toBe(201)
  sessionId = (await t.api.createSession('notes')).id
  expect((await t.api.send(sessionId, 'tenant A secret')).terminal?.type).toBe('run.completed')
  snapshotId = (await t.api.call('POST', `/v1/sessions/${sessionId}/snapshots`, {})).body.id
  const b = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b', role: 'admin' })
  const ro = await t.api.call('POST', '/v1/keys', { role: 'read', name: 'viewer' })
  ;[owner, tenantB, readOnly] = await Promise.all([connect(t.key), connect(b.body.key), connect(ro.body.key)])
  tools = (await owner.listTools()).tools
})

afterAll(async () => {
  await Promise.all([owner?.close(), tenantB?.close(), readOnly?.close()])
  await t?.close()
})

describe('MCP walls', () => {
  it("refuses tenant B every tool and resource on tenant A's session, and shows it nothing of A's", async () => {
    const before = await tenantAState()
    const swept: string[] = []
    for (const tool of tools) {
      if (!tool.inputSchema.properties?.sessionId) continue
      const error = refusal(await tenantB.callTool({ name: tool.name, arguments: argsFor(tool) }), tool.name)
      expect(error.code, `${tool.name}: ${error.message}`).toMatch(/^(session_)?not_found$/)
      swept.push(tool.name)
    }
    expect(swept.length).toBeGreaterThanOrEqual(12)
    // The tools that take no session: none shows or uses tenant A's agent or sessions.
    expect(swept.length + 3).toBe(tools.length)
    expect(
      refusal(await tenantB.callTool({ name: 'create_session', arguments: { agent: 'notes' } }), 'create')
        .code,
    ).toBe('agent_not_found')
    expect((await tenantB.callTool({ name: 'list_agents', arguments: {} })).structuredContent).toEqual({
      data: [],
    })
    const listed = await tenantB.callTool({ name: 'list_sessions', arguments: {} })
    expect(listed.structuredContent).toMatchObject({ data: [] })
    expect((await tenantB.listResources()).resources).toEqual([])
    for (const uri of [
      `cairn://sessions/${sessionId}/transcript`,
      `cairn://sessions/${sessionId}/files/notes.md`,
    ]) {
      await expect(tenantB.readResource({ uri })).rejects.toMatchObject({ code: -32002 })
    }
    expect(await tenantAState()).toEqual(before)
  })

  it('offers a read-only key the read tools only and refuses it the others with forbidden', async () => {
    const before = await tenantAState()
    const offered = (await readOnly.listTools()).tools
    expect(offered.length).toBeGreaterThan(3)
    expect(offered.every((tool) => tool.annotations?.readOnlyHint === true)).toBe(true)
    const writers = tools.filter((tool) => !offered.some((o) => o.name === tool.name))
    expect(writers.map((tool) => tool.annotations?.readOnlyHint)).toEqual(writers.map(() => false))
    for (const tool of writers) {
      const error = refusal(await readOnly.callTool({ name: tool.name, arguments: argsFor(tool) }), tool.name)
      expect(error.code, tool.name).toBe('forbidden')
    }
    expect(await tenantAState()).toEqual(before)
  })

  it('refuses an argument of the wrong type naming the field, and changes nothing (property-based)', async () => {
    const before = await tenantAState()
    const byName = new Map(tools.map((tool) => [tool.name, tool]))
    const fields = tools.flatMap((tool) =>
      Object.entries(tool.inputSchema.properties ?? {}).map(([field, schema]) => ({
        name: tool.name,
        field,
        schema,
      })),
    )
    await fc.assert(
      fc.asyncProperty(
        fc
          .constantFrom(...fields)
          .chain(({ name, field, schema }) => wrongValue(schema).map((value) => ({ name, field, value }))),
        async ({ name, field, value }) => {
          const args = { ...argsFor(byName.get(name) as Tool), [field]: value }
          const error = refusal(
            await owner.callTool({ name, arguments: args }),
            `${name}.${field} = ${JSON.stringify(value)}`,
          )
          expect(error.code).toBe('validation_failed')
          expect(error.message).toContain(`arguments/${field}`)
        },
      ),
      { numRuns: 100 },
    )
    expect(await tenantAState()).toEqual(before)
  })
})

/** The JSON types a property's schema admits (a union's branches', a constant's). */
function jsonTypes(schema: unknown): Set<string> {
  const s = schema as { type?: string | string[]; anyOf?: unknown[]; const?: unknown }
  const types = new Set<string>(Array.isArray(s.type) ? s.type : s.type ? [s.type] : [])
  if (s.const !== undefined) types.add(s.const === null ? 'null' : typeof s.const)
  for (const branch of s.anyOf ?? []) for (const type of jsonTypes(branch)) types.add(type)
  if (types.has('number')) types.add('integer')
  return types
}

/** A value of a JSON type the schema does not admit. */
function wrongValue(schema: unknown): fc.Arbitrary<unknown> {
  const admitted = jsonTypes(schema)
  const kinds: [string, fc.Arbitrary<unknown>][] = [
    ['string', fc.string({ maxLength: 8 })],
    ['integer', fc.integer()],
    ['boolean', fc.boolean()],
    ['array', fc.array(fc.integer(), { maxLength: 3 })],
    ['object', fc.dictionary(fc.string({ minLength: 1, maxLength: 4 }), fc.integer(), { maxKeys: 2 })],
    ['null', fc.constant(null)],
  ]
  return fc.oneof(...kinds.filter(([kind]) => !admitted.has(kind)).map(([, arbitrary]) => arbitrary))
}
