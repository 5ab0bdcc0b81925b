import { type ChildProcess, execFileSync } from 'node:child_process'
import { lookup } from 'node:dns/promises'
import { cp, readFile, writeFile } from 'node:fs/promises'
import path from 'node:path'
import type { StreamEvent } from '@cairn/protocol'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createNetnsHost, type NetnsHost, netnsAddresses } from './helpers/netns.js'
import { scratchDir } from './helpers/scratch.js'
import { EXAMPLES, REPO_ROOT, startTestServer, type TestServer } from './helpers/server.js'

// The framework examples, deployed as they are (their npm dependencies installed by the revision
// build through the egress proxy) and pointed at a self-hosted model server the way the examples'
// READMEs say: a base-URL secret, the server's name in `network.allow`, and (for a name without
// public DNS) the operator's `egressHosts` (CAIRN_EGRESS_HOSTS) plus a private-address exception.
// The "model server" is a stand-in for a hosted API outside the machine, in a network namespace of
// its own: test/fixtures/fake-model-server.mjs (OpenAI Responses and Anthropic Messages, SSE).
// The file takes about 4 minutes: four revision builds (npm ci through the egress proxy; the Claude
// Agent SDK's is ~50 s, its Claude Code binary a 175 MB download) and each example's turns.
const SUBNET = 226
const { address: MODEL_ADDRESS } = netnsAddresses(SUBNET)
const MODEL_HOST = `models-${process.pid}.cairn.test`
const MODEL_PORT = 8080
const MODEL_URL = `http://${MODEL_HOST}:${MODEL_PORT}`
const NOTES = 'the launch code is 4-8-15-16'

let netnsHost: NetnsHost | undefined
let modelServer: ChildProcess | undefined
let requestLog = ''
let t: TestServer

interface LoggedRequest {
  url: string
  body: { messages?: unknown[] }
  authorization: string | null
  apiKey: string | null
  stream: boolean
}

const loggedRequests = async (): Promise<LoggedRequest[]> =>
  (await readFile(requestLog, 'utf8'))
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as LoggedRequest)

interface Example {
  name: 'openai-agents' | 'langchain' | 'mastra' | 'claude-agent-sdk'
  /** The model API path the framework calls on the server. */
  apiPath: string
  /** Runtime secrets pointing the framework at the model server. */
  env: Record<string, string>
  /** The API key, a proxy secret: the agent holds a stand-in, the proxy sends this to the server. */
  key: { name: string; value: string }
  /** How the server sees the key. */
  sentKey: (request: LoggedRequest) => string | null
}

const EXAMPLE_SETUPS: Example[] = [
  {
    name: 'openai-agents',
    apiPath: '/v1/responses',
    // The OpenAI SDK's base URL includes /v1. Tracing would go to api.openai.com: off.
    env: { OPENAI_BASE_URL: `${MODEL_URL}/v1`, OPENAI_AGENTS_DISABLE_TRACING: '1' },
    key: { name: 'OPENAI_API_KEY', value: 'sk-fake-openai-3f9a1c' },
    sentKey: (request) => request.authorization,
  },
  {
    name: 'langchain',
    apiPath: '/v1/messages',
    // The Anthropic SDK's base URL is without /v1 (it asks for /v1/messages).
    env: { ANTHROPIC_BASE_URL: MODEL_URL },
    key: { name: 'ANTHROPIC_API_KEY', value: 'sk-ant-fake-7d2e4b' },
    sentKey: (request) => request.apiKey,
  },
  {
    name: 'mastra',
    apiPath: '/v1/messages',
    // The AI SDK's Anthropic provider (Mastra's model router) appends /messages: /v1 included.
    env: { ANTHROPIC_BASE_URL: `${MODEL_URL}/v1` },
    key: { name: 'ANTHROPIC_API_KEY', value: 'sk-ant-fake-mastra-51c0' },
    sentKey: (request) => request.apiKey,
  },
  {
    name: 'claude-agent-sdk',
    // Claude Code asks for /v1/messages?beta=true, its base URL without /v1; its side traffic
    // (telemetry, update checks) off, as for any model server of one's own.
    apiPath: '/v1/messages?beta=true',
    env: { ANTHROPIC_BASE_URL: MODEL_URL, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1' },
    key: { name: 'ANTHROPIC_API_KEY', value: 'sk-ant-fake-claude-93b1' },
    sentKey: (request) => request.apiKey,
  },
]
/** The examples that keep their conversation by replaying the session's transcript. */
const REPLAYING = EXAMPLE_SETUPS.filter((example) => example.name !== 'claude-agent-sdk')

/** Build times of the examples' first revisions (npm ci through the egress proxy), by name. */
const buildMs: Record<string, number> = {}

/** A copy of the example with the model server's name added to its `network.allow`. */
async function exampleProject(name: string): Promise<string> {
  const dir = await scratchDir(`cairn-example-${name}-`)
  await cp(path.join(EXAMPLES, name), dir, {
    recursive: true,
    filter: (source) => path.basename(source) !== 'node_modules',
  })
  const manifestPath = path.join(dir, 'cairn.yaml')
  const manifest = await readFile(manifestPath, 'utf8')
  const allowed = manifest.replace(
    /\nnetwork:\n {2}allow:\n/,
    (found) => `${found}    - ${MODEL_HOST}:${MODEL_PORT}\n`,
  )
  expect(allowed).not.toBe(manifest)
  await writeFile(manifestPath, allowed)
  return dir
}

/** The revision's build log once its build has ended (polled: an install can outlast an HTTP wait). */
async function builtRevision(agent: string, revision: string) {
  for (;;) {
    const logs = await t.api.call('GET', `/v1/agents/${agent}/revisions/${revision}/logs`)
    if (logs.body.status !== 'DEPLOYING') return logs.body
    await new Promise((r) => setTimeout(r, 1000))
  }
}

beforeAll(async () => {
  const dir = await scratchDir('cairn-fake-model-')
  requestLog = path.join(dir, 'requests.jsonl')
  await writeFile(requestLog, '')
  netnsHost = createNetnsHost('fwex', SUBNET)
  const server = netnsHost.spawn(
    [
      process.execPath,
      path.join(REPO_ROOT, 'test/fixtures/fake-model-server.mjs'),
      MODEL_ADDRESS,
      String(MODEL_PORT),
      requestLog,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  )
  modelServer = server
  await new Promise<void>((resolve, reject) => {
    server.stdout?.once('data', () => resolve())
    server.once('exit', (code) => reject(new Error(`fake model server exited with ${code}`)))
  })

  // The builds' npm registry (the host's, as the server's default build allowlist): where it sits
  // on an internal address (a mirror), the operator allows that address, as for any private one.
  const registry = new URL(execFileSync('npm', ['config', 'get', 'registry'], { encoding: 'utf8' }).trim())
  const registryAddresses = (await lookup(registry.hostname, { all: true })).map((a) => a.address)
  t = await startTestServer({
    server: {
      egressPrivateExceptions: [MODEL_ADDRESS, ...registryAddresses],
      egressHosts: { [MODEL_HOST]: MODEL_ADDRESS },
    },
  })
  for (const example of EXAMPLE_SETUPS) {
    const started = Date.now()
    const deployed = await t.api.deploy(await exampleProject(example.name))
    expect(deployed.status).toBe(201)
    const revision = await builtRevision(example.name, deployed.body.revision.id)
    buildMs[example.name] = Date.now() - started
    expect(revision.status, JSON.stringify(revision)).toBe('READY')
    expect(
      (await t.api.call('PUT', `/v1/agents/${example.name}/secrets`, { secrets: example.env })).status,
    ).toBe(200)
    const key = await t.api.call('PUT', `/v1/agents/${example.name}/secrets`, {
      secrets: { [example.key.name]: example.key.value },
      scope: 'proxy',
      hosts: [`${MODEL_HOST}:${MODEL_PORT}`],
    })
    expect(key.status).toBe(200)
  }
  console.log(`example builds (npm ci through the egress proxy): ${JSON.stringify(buildMs)}`)
}, 900_000)

afterAll(async () => {
  await t?.close()
  modelServer?.kill('SIGKILL')
  netnsHost?.remove()
})

const ofType = <T extends StreamEvent['type']>(events: StreamEvent[], type: T) =>
  events.filter((e): e is Extract<StreamEvent, { type: T }> => e.type === type)

describe('framework examples against a self-hosted model server', () => {
  it.each(REPLAYING)(
    '$name: two turns with a tool call each, then a cold start that keeps the conversation',
    async (example) => {
      const { id } = await t.api.createSession(example.name)
      const upload = await t.api.call('PUT', `/v1/sessions/${id}/files/content?path=notes.txt`, NOTES, {
        'content-type': 'application/octet-stream',
      })
      expect(upload.status).toBe(200)
      const before = (await loggedRequests()).length

      for (const [turn, prompt] of ['What do my notes say?', 'And again?'].entries()) {
        const reply = await t.api.send(id, prompt)
        expect(reply.terminal?.type, JSON.stringify(reply.events)).toBe('run.completed')
        // The text is the fake model's, quoting what the tool read from the workspace, and it saw
        // every user message of the conversation so far.
        expect(reply.text).toBe(`Fake model, user message ${turn + 1}: notes.txt says "${NOTES}".`)
        expect(ofType(reply.events, 'message.delta').length).toBeGreaterThan(1) // streamed
        const [start] = ofType(reply.events, 'tool.start')
        expect(start).toMatchObject({ name: 'read_file', input: { path: 'notes.txt' } })
        const [end] = ofType(reply.events, 'tool.end')
        expect(end).toMatchObject({ toolCallId: start?.toolCallId })
        expect(end?.isError).not.toBe(true)
        expect(JSON.stringify(end?.output)).toContain(NOTES)
        if (turn === 1) expect(ofType(reply.events, 'run.started')[0]).toMatchObject({ coldStart: false })
      }

      // The session's sandbox is stopped: the next turn starts a new one, and the agent rebuilds
      // the conversation from the session's transcript.
      await t.server.sessions.stopSandbox(id)
      expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.warm).toBe(false)
      const cold = await t.api.send(id, 'Once more?')
      expect(cold.terminal?.type, JSON.stringify(cold.events)).toBe('run.completed')
      expect(ofType(cold.events, 'run.started')[0]).toMatchObject({ coldStart: true })
      expect(cold.text).toBe(`Fake model, user message 3: notes.txt says "${NOTES}".`)
      expect(ofType(cold.events, 'tool.start')).toHaveLength(1)

      const transcript = await t.api.call('GET', `/v1/sessions/${id}/messages`)
      expect(transcript.body.data.map((m: { role: string; content: string }) => [m.role, m.content])).toEqual(
        [
          ['user', 'What do my notes say?'],
          ['assistant', `Fake model, user message 1: notes.txt says "${NOTES}".`],
          ['user', 'And again?'],
          ['assistant', `Fake model, user message 2: notes.txt says "${NOTES}".`],
          ['user', 'Once more?'],
          ['assistant', `Fake model, user message 3: notes.txt says "${NOTES}".`],
        ],
      )

      // Two model calls a turn (the tool call, then the answer), streamed, on the framework's API
      // path, each with the real key the proxy swapped in for the agent's stand-in.
      const requests = (await loggedRequests()).slice(before)
      expect(requests).toHaveLength(6)
      for (const request of requests) {
        expect(request).toMatchObject({ url: example.apiPath, stream: true })
        expect(example.sentKey(request)).toContain(example.key.value)
      }
    },
    300_000,
  )

  it('claude-agent-sdk: after a cold start Claude resumes its own session, kept in the persisted ~/.claude', async () => {
    const example = EXAMPLE_SETUPS.find((e) => e.name === 'claude-agent-sdk') as Example
    const { id } = await t.api.createSession(example.name)
    const upload = await t.api.call('PUT', `/v1/sessions/${id}/files/content?path=notes.txt`, NOTES, {
      'content-type': 'application/octet-stream',
    })
    expect(upload.status).toBe(200)
    const before = (await loggedRequests()).length
    const prompts = ['What do my notes say?', 'And again?', 'Once more?']
    for (const [turn, prompt] of prompts.entries()) {
      // Before the third turn the sandbox is stopped (not kept warm): Claude Code starts in a new
      // one, and this agent replays nothing of Cairn's transcript; only Claude's own session,
      // stored in ~/.claude (cairn.yaml `persist:`), can carry the conversation over.
      if (turn === 2) {
        await t.server.sessions.stopSandbox(id)
        expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.warm).toBe(false)
      }
      const reply = await t.api.send(id, prompt)
      expect(reply.terminal?.type, JSON.stringify(reply.events)).toBe('run.completed')
      expect(ofType(reply.events, 'run.started')[0]).toMatchObject({ coldStart: turn !== 1 })
      // The fake model counts the user messages it was sent: 3 on the cold turn is Claude's resume.
      expect(reply.text).toBe(`Fake model, user message ${turn + 1}: notes.txt says "${NOTES}".`)
      const [start] = ofType(reply.events, 'tool.start')
      expect(start).toMatchObject({ name: 'Bash', input: { command: 'cat notes.txt' } })
      const [end] = ofType(reply.events, 'tool.end')
      expect(end).toMatchObject({ toolCallId: start?.toolCallId })
      expect(JSON.stringify(end?.output)).toContain(NOTES)
    }
    const requests = (await loggedRequests()).slice(before)
    for (const request of requests) {
      expect(request).toMatchObject({ url: example.apiPath, stream: true })
      expect(example.sentKey(request)).toContain(example.key.value)
    }
    const conversation = JSON.stringify(requests.at(-1)?.body.messages)
    for (const prompt of prompts) expect(conversation).toContain(prompt)
    // Claude's session file is kept with the workspace, under the persisted path, not among the
    // workspace's own files (without `persist:` Claude's home would be /workspace itself).
    const root = await t.api.call('GET', `/v1/sessions/${id}/files`)
    expect(root.status).toBe(200)
    expect(JSON.stringify(root.body)).toContain('notes.txt')
    expect(JSON.stringify(root.body)).not.toContain('.claude')
    const manifest = (await t.api.call('GET', `/v1/sessions/${id}/manifest`)).body
    expect(manifest.persist).toEqual([
      expect.objectContaining({ path: '~/.claude', sandboxPath: '/home/agent/.claude' }),
    ])
    const kept = manifest.persist[0].workspacePath as string
    const added = manifest.dirtyFiles.added as string[]
    expect(
      added.filter((p) => p.startsWith(`${kept}/projects/`) && p.endsWith('.jsonl')),
      added.join(),
    ).not.toEqual([])
  }, 300_000)
})
