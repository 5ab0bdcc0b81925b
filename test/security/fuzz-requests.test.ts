import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { appendFile, cp, mkdir, mkdtemp, readFile, rm } from 'node:fs/promises'
import http from 'node:http'
import os from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { ERROR_CODES, isErrorCode } from '@cairn/protocol'
import { instanceRunDir } from '@cairn/runtime'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  deepJson,
  FUZZ_MARKER,
  fromSchema,
  fuzzJson,
  fuzzSeed,
  fuzzString,
  type JsonSchema,
  listTree,
  markerEntries,
  mutate,
  pollutedJson,
  Rng,
  SHARED_PLACES,
  type SharedPlaces,
  traversal,
} from '../helpers/fuzz.js'
import { LinkPool } from '../helpers/fuzz-links.js'
import { OpenApiConformance, type Operation } from '../helpers/openapi-conformance.js'
import { makeProject, REVIEWER_PROJECT } from '../helpers/projects.js'
import { Api, EXAMPLES, packDir, REPO_ROOT } from '../helpers/server.js'

// Request-schema fuzzing against a real server in its own process: every route of the OpenAPI
// document gets schema-shaped and hostile bodies, path parameters and query strings. The server
// must answer each with a typed error or a success, never a 500, never crash, and never write
// outside its data dir and pool. Every answer is also checked against the document itself (its
// status, media type and body schema, each SSE event), and every operation must reach a success.
// The run is stateful: the IDs a successful POST hands out (sessions, snapshots, turns, artifacts,
// agents, revisions, keys) are fed to later requests (LinkPool), so operations are fuzzed on what
// other operations made. A method the document does not list for a path must answer 405 with the
// document's methods in Allow; a request without a query parameter the document marks required
// must be refused. A finding prints its request in full (with the linked IDs it used).

const SEED = fuzzSeed('fuzz-requests', 0x5eed_0006)
const REQUESTS = Number(process.env.FUZZ_REQUESTS ?? 10_000)
const CONCURRENCY = 8
const REQUEST_TIMEOUT_MS = 30_000
const FIXTURE = path.join(REPO_ROOT, 'test/fixtures/server-process.mjs')
/** The compat API's prefix (`--compat-prefix`): its routes are in the document and fuzzed too. */
const COMPAT = '/superserve'
const isCompat = (template: string) => template.startsWith(`${COMPAT}/`)
/** A route's template as the native API spells it (the compat prefix taken off). */
const local = (template: string) => (isCompat(template) ? template.slice(COMPAT.length) : template)
/** 5xx codes the registry marks retryable that a genuine runtime hiccup may produce (none seen so far). */
const TOLERATED_5XX = new Set<string>([])

interface Route {
  method: string
  template: string
  query: { name: string; schema: JsonSchema; required: boolean }[]
  body: JsonSchema | undefined
  /** The request body's media types the operation documents. */
  bodyTypes: string[]
}

interface FuzzRequest {
  index: number
  method: string
  path: string
  headers: Record<string, string>
  body: Buffer | undefined
  authenticated: boolean
  /** The path names a /v1 API route (so an unauthenticated success would be a bypass). */
  api: boolean
  /** The path was rewritten (case, slashes, dot segments), so the router may not match it. */
  variant: boolean
}

let sentinel = ''
let dataDir = ''
let cwdDir = ''
let child: ChildProcess | undefined
let serverPid = 0
let base: URL
let key = ''
let readKey = ''
let api: Api
const serverLog: string[] = []
const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY })
const links = new LinkPool()

const ids = {
  liveSession: '',
  /** A fork of the live session, so a merge has something to merge. */
  fork: '',
  endedSession: '',
  deletedSession: '',
  spareSessions: [] as string[],
  agent: '',
  victimAgent: '',
  /** An agent the compat API's delete takes (the native delete takes victimAgent). */
  compatVictimAgent: '',
  revision: '',
  snapshot: '',
  victimKey: '',
  webhook: '',
  victimWebhook: '',
  artifact: '',
  turn: '',
  command: '',
  endedCommand: '',
  /** A session whose agent asked for approval, and its request (pending until the run answers it). */
  approvalSession: '',
  approval: '',
}

/**
 * A webhook the address guard accepts (a public address, no name to resolve) for an event a single
 * server never sends (a node lost, in a cluster only), so the run makes no deliveries leave the
 * machine (approval.requested, which it once used, is sent since approvals are: the run asks one).
 */
const WEBHOOK = { url: 'https://93.184.215.14/fuzz', events: ['session.node_lost'] }

/** The shared places, and where a server started from this checkout could also write. */
const PLACES: SharedPlaces = [...SHARED_PLACES, ['/run', 1], [REPO_ROOT, 2]]

const markersNow = () => markerEntries(PLACES, (r) => r.endsWith('node_modules'))

beforeAll(async () => {
  sentinel = await mkdtemp(path.join(os.tmpdir(), 'cairn-fuzz-req-'))
  dataDir = path.join(sentinel, 'data')
  cwdDir = path.join(sentinel, 'cwd')
  await mkdir(dataDir)
  await mkdir(cwdDir)
  const options = { rateLimitPerSecond: 0, compatPrefix: COMPAT }
  child = spawn(process.execPath, [FIXTURE, dataDir, JSON.stringify(options)], {
    cwd: cwdDir,
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child?.stdout as NodeJS.ReadableStream }).once('line', resolve)
    child?.once('exit', (code) => reject(new Error(`server exited early with ${code}`)))
  })
  // Later lines are the server's error log: kept to explain a finding.
  child.stdout?.on('data', (chunk: Buffer) => serverLog.push(chunk.toString('utf8')))
  const started = JSON.parse(line) as { url: string; pid: number }
  serverPid = started.pid
  base = new URL(started.url)
  key = (await readFile(path.join(dataDir, 'admin.key'), 'utf8')).trim()
  api = new Api(started.url, key)

  // The echo example with a resume phase, so its routes answer too (see the live session below).
  const echoDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-fuzz-echo-'))
  await cp(`${EXAMPLES}/echo`, echoDir, { recursive: true })
  await appendFile(path.join(echoDir, 'cairn.yaml'), 'session:\n  resume: echo resumed\n')
  const archive = await packDir(echoDir)
  await rm(echoDir, { recursive: true, force: true })
  const deployed = await api.call('POST', '/v1/agents', archive)
  expect(deployed.status).toBe(201)
  ids.agent = deployed.body.agent.id
  ids.revision = deployed.body.revision.id
  const victim = await api.call('POST', '/v1/agents?name=victim', archive)
  expect(victim.status).toBe(201)
  ids.victimAgent = victim.body.agent.id
  const compatVictim = await api.call('POST', '/v1/agents?name=compat-victim', archive)
  expect(compatVictim.status).toBe(201)
  ids.compatVictimAgent = compatVictim.body.agent.id
  // With a setup phase, so its setup routes answer too.
  ids.liveSession = (await api.createSession('echo', { setup: { command: 'echo set up' } })).id
  expect((await api.send(ids.liveSession, 'warm up')).text).toBe('warm up\n')
  // Ended and messaged again: a cold start on its workspace runs the resume phase.
  expect((await api.call('POST', `/v1/sessions/${ids.liveSession}/end`)).status).toBe(200)
  expect((await api.send(ids.liveSession, 'resumed')).text).toBe('resumed\n')
  expect((await api.call('GET', `/v1/sessions/${ids.liveSession}/resume-phase`)).body).toMatchObject({
    status: 'succeeded',
  })
  ids.turn = (await api.call('GET', `/v1/sessions/${ids.liveSession}/turns`)).body.data[0].id
  ids.snapshot = (await api.call('POST', `/v1/sessions/${ids.liveSession}/snapshots`, {})).body.id
  // A command reading its stdin until the well-formed stdin write closes it (see `wellFormedJson`),
  // so every output stream of it ends once the well-formed requests are done; the well-formed read
  // of output is of one that has ended. The run's own starts make more (ending within 3 s).
  const command = await api.call('POST', `/v1/sessions/${ids.liveSession}/commands`, {
    command: ['cat'],
    stdin: true,
  })
  expect(command.status, JSON.stringify(command.body)).toBe(201)
  ids.command = command.body.id
  // A service on port 8000, so a signed URL for it is issued while the sandbox runs (one for a
  // port nothing listens on is refused then).
  const service = await api.call('POST', `/v1/sessions/${ids.liveSession}/commands`, {
    command: ['python3', '-m', 'http.server', '8000', '--bind', '127.0.0.1'],
  })
  expect(service.status, JSON.stringify(service.body)).toBe(201)
  for (let i = 0; i < 100; i++) {
    const manifest = await api.call('GET', `/v1/sessions/${ids.liveSession}/manifest`)
    if ((manifest.body.openPorts as number[]).includes(8000)) break
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  const ended = await api.call('POST', `/v1/sessions/${ids.liveSession}/commands`, {
    command: ['echo', 'ended'],
  })
  ids.endedCommand = ended.body.id
  for (let i = 0; i < 100; i++) {
    const got = await api.call('GET', `/v1/sessions/${ids.liveSession}/commands/${ids.endedCommand}`)
    if (got.body.status === 'exited') break
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  const forked = await api.call('POST', `/v1/sessions/${ids.liveSession}/fork`, { snapshotId: ids.snapshot })
  expect(forked.status, JSON.stringify(forked.body)).toBe(201)
  ids.fork = forked.body.id
  ids.endedSession = (await api.createSession('echo')).id
  expect((await api.call('POST', `/v1/sessions/${ids.endedSession}/end`)).status).toBe(200)
  ids.deletedSession = (await api.createSession('echo')).id
  expect((await api.call('DELETE', `/v1/sessions/${ids.deletedSession}`)).status).toBe(200)
  for (let i = 0; i < 3; i++) ids.spareSessions.push((await api.createSession('echo')).id)
  ids.victimKey = (await api.call('POST', '/v1/keys', { name: 'victim' })).body.id
  for (const which of ['webhook', 'victimWebhook'] as const) {
    const hook = await api.call('POST', '/v1/webhooks', WEBHOOK)
    expect(hook.status, JSON.stringify(hook.body)).toBe(201)
    ids[which] = hook.body.id
  }
  readKey = (await api.call('POST', '/v1/keys', { name: 'reader', role: 'read' })).body.key
  expect((await api.call('PUT', `/v1/agents/${ids.agent}/secrets`, { secrets: { K1: 'v' } })).status).toBe(
    200,
  )
  const artifact = await api.call('POST', `/v1/sessions/${ids.liveSession}/artifacts`, { path: 'echo.sh' })
  expect(artifact.status, JSON.stringify(artifact.body)).toBe(201)
  ids.artifact = artifact.body.id
  const reviewer = await api.call('POST', '/v1/agents', await packDir(await makeProject(REVIEWER_PROJECT)))
  expect(reviewer.status, JSON.stringify(reviewer.body)).toBe(201)
  ids.approvalSession = (await api.createSession('reviewed')).id
  const asked = await api.send(ids.approvalSession, 'ask fuzz')
  const requested = asked.events.find((e) => e.type === 'approval.requested')
  ids.approval = requested?.type === 'approval.requested' ? requested.approvalId : ''
  expect(ids.approval).toMatch(/^apr_/)
  links.protect(...Object.values(ids).flat())
}, 120_000)

afterAll(async () => {
  agent.destroy()
  if (child && child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((resolve) => child?.once('exit', resolve))
    child.kill('SIGTERM')
    await exited
  }
  if (sentinel) await rm(sentinel, { recursive: true, force: true })
})

function routesOf(doc: { paths: Record<string, Record<string, Record<string, unknown>>> }): Route[] {
  const routes: Route[] = []
  for (const [template, methods] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(methods)) {
      const parameters = (op.parameters ?? []) as {
        in: string
        name: string
        schema: JsonSchema
        required?: boolean
      }[]
      const content = (op.requestBody as { content?: Record<string, { schema: JsonSchema }> } | undefined)
        ?.content
      routes.push({
        method: method.toUpperCase(),
        template,
        query: parameters
          .filter((p) => p.in === 'query')
          .map((p) => ({ name: p.name, schema: p.schema, required: p.required === true })),
        body: content?.['application/json']?.schema,
        bodyTypes: Object.keys(content ?? {}),
      })
    }
  }
  return routes
}

/** Percent-encodes the UTF-8 bytes (lone surrogates become U+FFFD, as on the wire). */
function pct(value: string): string {
  let out = ''
  for (const byte of Buffer.from(value, 'utf8')) {
    const c = String.fromCharCode(byte)
    out += /[A-Za-z0-9_.~-]/.test(c) ? c : `%${byte.toString(16).padStart(2, '0').toUpperCase()}`
  }
  return out
}

/** Raw (already encoded) segments no encoder produces: bad escapes, overlong UTF-8, dot segments. */
const RAW_SEGMENTS = [
  '%',
  '%zz',
  '%ff',
  '%c0%ae%c0%ae',
  '%2e%2e',
  '%2e%2e%2f%2e%2e',
  '..%5c..',
  '%00',
  ';x=1',
  '%252e%252e',
  'a%2fb',
  '%e2%80%ae',
]

function pathParam(rng: Rng, route: Route, method: string, name: string): string {
  const raw = (value: string) => (rng.chance(0.08) ? rng.pick(RAW_SEGMENTS) : pct(value))
  const fake = (prefix: string) => `${prefix}_${'0'.repeat(20)}`
  const template = local(route.template)
  // Deleting the session, agent or key everything else uses would end the run's coverage early.
  const destructive = method === 'DELETE' && template.split('/').length <= 4
  const pick = (real: string[]) => {
    const r = rng.next()
    const linked = links.pick(rng, route.template, name)
    if (r < 0.2 && linked !== undefined) return pct(linked)
    if (r < 0.35 && real.length > 0) return pct(rng.pick(real))
    if (r < 0.55) return raw(traversal(rng))
    if (r < 0.65) return pct('z'.repeat(rng.pick([201, 1000, 4000])))
    if (r < 0.8) return pct(fake(rng.pick(['ses', 'agt', 'rev', 'snp', 'key', 'art'])))
    return raw(fuzzString(rng, { maxHuge: 3000 }))
  }
  if (name === 'id') {
    if (template.startsWith('/v1/sessions'))
      return pick(
        destructive
          ? ids.spareSessions
          : [
              ids.liveSession,
              ids.liveSession,
              ids.endedSession,
              ids.deletedSession,
              ids.liveSession.slice(0, 8),
            ],
      )
    if (template.startsWith('/v1/agents'))
      return pick(
        destructive
          ? [isCompat(route.template) ? ids.compatVictimAgent : ids.victimAgent]
          : [ids.agent, 'echo', 'victim', ids.victimAgent],
      )
    if (template.startsWith('/v1/keys')) return pick([ids.victimKey])
  }
  return pick(REAL_PARAMS[name]?.() ?? [])
}

/**
 * Real values of the other path parameters, by name. A new route whose parameter is not here gets
 * only made-up values, never answers 2xx, and fails the coverage check: add its real value.
 */
const REAL_PARAMS: Record<string, () => string[]> = {
  rev: () => [ids.revision],
  name: () => ['K1', 'SECRET', FUZZ_MARKER],
  snapshotId: () => [ids.snapshot],
  artifactId: () => [ids.artifact],
  turnId: () => [ids.turn],
  commandId: () => [ids.command, ids.endedCommand],
  approvalId: () => [ids.approval],
  port: () => ['8000', '3000'],
  key: () => ['K2', 'K1'],
}

/** The real IDs a well-formed request to `route` uses (DELETE on the spare and victim ones). */
function realParam(route: Route, name: string): string {
  const template = local(route.template)
  const compat = isCompat(route.template)
  const destructive = route.method === 'DELETE' && template.split('/').length <= 4
  if (name === 'id' && template === '/v1/sessions/{id}/merge') return ids.fork
  if (name === 'id' && template.includes('/approvals')) return ids.approvalSession
  if (name === 'id' && template.startsWith('/v1/sessions'))
    return destructive ? (ids.spareSessions[compat ? 1 : 0] as string) : ids.liveSession
  if (name === 'id' && template.startsWith('/v1/agents'))
    return destructive ? (compat ? ids.compatVictimAgent : ids.victimAgent) : ids.agent
  if (name === 'id' && template.startsWith('/v1/keys')) return ids.victimKey
  if (name === 'id' && template.startsWith('/v1/webhooks'))
    return destructive ? ids.victimWebhook : ids.webhook
  if (name === 'commandId') return route.template.endsWith('/output') ? ids.endedCommand : ids.command
  return REAL_PARAMS[name]?.()[0] ?? 'x'
}

const CONTENT_TYPES = [
  'application/json; charset=utf-8',
  'application/json; charset=utf-16',
  'application/json; charset=latin1',
  'APPLICATION/JSON',
  'application/json;;;',
  'text/plain',
  'text/html',
  'application/octet-stream',
  'application/gzip',
  'application/x-www-form-urlencoded',
  'multipart/form-data; boundary=x',
  'application/xml',
  '',
  'a/b',
  '*/*',
  'application/vnd.api+json',
]

const INVALID_JSON = [
  '',
  ' ',
  '{',
  '{"a":',
  '{"a":1,}',
  "{'a':1}",
  '{"a":NaN}',
  '{"a":Infinity}',
  '\ufeff{}',
  '{}garbage',
  '[1,2',
  'undefined',
  '{"a":"\\ud800"}',
  '{"a":"\\u00"}',
  '{"a":1}{"b":2}',
  '\u0000',
  '{"a":1,"a":2}',
]

function bodyFor(
  rng: Rng,
  route: Route,
  hints: Record<string, unknown[]>,
): { text: Buffer; type: string } | undefined {
  const schema: JsonSchema = route.body ?? { type: 'object', properties: {} }
  if (!route.body && rng.chance(0.6)) return undefined
  if (route.template.endsWith('/files/content') && rng.chance(0.7)) {
    return { text: rng.bytes(rng.int(4096)), type: rng.pick(['application/octet-stream', 'text/plain']) }
  }
  let text: string | Buffer
  const r = rng.next()
  if (r < 0.12) text = JSON.stringify(fromSchema(rng, schema, hints))
  else if (r < 0.55) {
    let value = fromSchema(rng, schema, hints)
    for (let i = 1 + rng.int(3); i > 0; i--) value = mutate(rng, schema, value)
    text = JSON.stringify(value)
  } else if (r < 0.63) text = pollutedJson(rng, fromSchema(rng, schema, hints))
  else if (r < 0.69) text = deepJson(rng, rng.pick([100, 1000, 10_000, 100_000]))
  else if (r < 0.8) text = rng.pick(INVALID_JSON)
  else if (r < 0.92) text = JSON.stringify(fuzzJson(rng)) ?? 'null'
  else if (r < 0.95) text = JSON.stringify({ prompt: 'p'.repeat(2_200_000) })
  else text = rng.bytes(rng.int(2000))
  const type = rng.chance(0.8) ? 'application/json' : rng.pick(CONTENT_TYPES)
  return { text: Buffer.isBuffer(text) ? text : Buffer.from(text, 'utf8'), type }
}

function queryFor(rng: Rng, route: Route, hints: Record<string, unknown[]>): string {
  const parts: string[] = []
  for (const param of route.query) {
    if (!param.required && rng.chance(0.35)) continue
    const value = rng.chance(0.5)
      ? fromSchema(rng, param.schema, hints, param.name)
      : fuzzString(rng, { maxHuge: 3000 })
    const encoded = rng.chance(0.05) ? rng.pick(RAW_SEGMENTS) : pct(String(value))
    parts.push(`${param.name}=${encoded}`)
    if (rng.chance(0.05)) parts.push(`${param.name}=${pct(fuzzString(rng, { maxHuge: 100 }))}`)
  }
  if (rng.chance(0.15)) {
    const name = rng.pick([
      '__proto__',
      'constructor',
      '__proto__[isAdmin]',
      'constructor[prototype][x]',
      'x',
      '',
    ])
    parts.push(`${pct(name)}=${pct(fuzzString(rng, { maxHuge: 100 }))}`)
  }
  if (rng.chance(0.03)) parts.push(rng.pick(['&&&', '=', '==', 'a', '%', '%zz=1']))
  return parts.length > 0 ? `?${parts.join('&')}` : rng.chance(0.05) ? '?' : ''
}

/** The hints, with an ID another operation made for each ID field (snapshotId, sessionId, agent). */
function linkedHints(rng: Rng, route: Route, hints: Record<string, unknown[]>): Record<string, unknown[]> {
  const out = { ...hints }
  for (const name of ['snapshotId', 'sessionId', 'agent']) {
    const linked = links.pick(rng, route.template, name)
    if (linked !== undefined) out[name] = [linked, ...(hints[name] ?? [])]
  }
  return out
}

/** Variants of an API path a router or auth check might treat differently. */
function pathVariant(rng: Rng, apiPath: string): string {
  switch (rng.int(8)) {
    case 0:
      return `/${apiPath}`
    case 1:
      return apiPath.replace('/v1/', '/V1/')
    case 2:
      return `${apiPath}/`
    case 3:
      return apiPath.replace('/v1/', '/v1//')
    case 4:
      return apiPath.replace('/v1/', '/v1/./')
    case 5:
      return apiPath.replace('/v1/', '/%76%31/')
    case 6:
      return `/x/..${apiPath}`
    default:
      return apiPath
  }
}

function generate(index: number, routes: Route[], hints: Record<string, unknown[]>): FuzzRequest {
  const rng = new Rng((SEED + Math.imul(index, 0x9e3779b1)) >>> 0)
  const headers: Record<string, string> = {}
  let authenticated = true
  const authRoll = rng.next()
  if (authRoll < 0.03) authenticated = false
  else if (authRoll < 0.05) {
    headers.authorization = rng.pick([
      `Bearer ${key}x`,
      `Basic ${key}`,
      'Bearer',
      `Bearer  ${fuzzString(rng, { maxHuge: 200 }).replace(/[^\x21-\x7e]/g, '')}`,
    ])
    authenticated = false
  } else if (authRoll < 0.08) {
    // A key that may read but not write: its refusals (403) must be documented too.
    headers.authorization = `Bearer ${readKey}`
  }
  if (authenticated) headers.authorization ??= `Bearer ${key}`

  if (rng.chance(0.02)) {
    // Off the API: the console's static files and unknown paths.
    const raw = rng.chance(0.5) ? rng.pick(RAW_SEGMENTS) : pct(traversal(rng))
    const target = rng.pick([
      `/assets/${raw}`,
      `/assets/../../../../etc/passwd`,
      `/${raw}`,
      `/v2/${raw}`,
      '/healthz',
    ])
    return {
      index,
      method: rng.pick(['GET', 'POST', 'HEAD']),
      path: target,
      headers,
      body: undefined,
      authenticated,
      api: false,
      variant: false,
    }
  }

  const route = rng.pick(routes)
  const method = rng.chance(0.03)
    ? rng.pick(['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS'])
    : route.method
  let apiPath = route.template.replace(/\{(\w+)\}/g, (_m, name: string) =>
    pathParam(rng, route, method, name),
  )
  const variant = rng.chance(0.05)
  if (variant) apiPath = pathVariant(rng, apiPath)
  const body = bodyFor(rng, route, linkedHints(rng, route, hints))
  if (body?.type) headers['content-type'] = body.type
  if (rng.chance(0.02))
    headers.accept = rng.pick(['text/event-stream', 'application/xml', '*/*;q=0', '\u00ff'])
  // Headers past what the server reads (16 KiB): refused before any route, in the registry's shape.
  const padded = rng.chance(0.004)
  if (padded) headers['x-fuzz-padding'] = 'p'.repeat(rng.pick([8_000, 17_000, 70_000]))
  return {
    index,
    method,
    path: apiPath + queryFor(rng, route, hints),
    headers,
    body: padded ? undefined : body?.text,
    authenticated,
    api: true,
    variant,
  }
}

/**
 * One well-formed request per operation with real IDs, so every operation is seen answering past
 * its 404s (success schemas and the SSE stream included). Writes come after reads, deletes last.
 */
function wellFormed(
  index: number,
  route: Route,
  hints: Record<string, unknown[]>,
  samples: Samples,
): FuzzRequest {
  const rng = new Rng((SEED ^ Math.imul(index + 1, 0x85ebca6b)) >>> 0)
  // Paths: a directory to list, an existing file to read, a file the upload made to delete.
  const file = route.template.endsWith('/files') && route.method === 'GET' ? '' : 'echo.sh'
  const path = route.method === 'PUT' || route.method === 'DELETE' ? 'fuzzed.txt' : file
  const schemaHints = {
    ...hints,
    path: [path],
    agent: ['echo'],
    name: ['fuzzed'],
    url: [WEBHOOK.url],
    events: [WEBHOOK.events],
    // The compat API's names for the agent and an ID prefix.
    agent_id: ['echo'],
    id_prefix: [ids.liveSession.slice(0, 8)],
  }
  const apiPath = route.template.replace(/\{(\w+)\}/g, (_m, name: string) => pct(realParam(route, name)))
  const query = route.query
    .filter((q) => q.required || q.name === 'path')
    .map((q) => `${q.name}=${pct(String(schemaHints[q.name]?.[0] ?? fromSchema(rng, q.schema, {}, q.name)))}`)
  const headers: Record<string, string> = { authorization: `Bearer ${key}` }
  let body: Buffer | undefined
  const type = route.bodyTypes[0]
  let contentType = type
  if (type === 'application/json' && route.body) {
    body = Buffer.from(JSON.stringify(wellFormedJson(route, rng, schemaHints)))
  } else if (type === 'multipart/form-data') {
    // The compat deploy: their form's fields and the project's tar.gz.
    const boundary = `fuzz${rng.int(1_000_000)}`
    contentType = `multipart/form-data; boundary=${boundary}`
    body = multipart(boundary, { name: 'compat-echo', command: 'bash echo.sh', config: '{}' }, samples.agent)
  } else if (type !== undefined)
    body = type.includes('gzip')
      ? samples[route.template.startsWith('/v1/agents') ? 'agent' : 'workspace']
      : Buffer.from('fuzzed\n')
  else if (route.template.endsWith('/files/content') && route.method === 'PUT') body = Buffer.from('fuzzed\n')
  if (body) headers['content-type'] = contentType ?? 'application/octet-stream'
  if (route.template === '/v1/agents' && route.method === 'POST') query.push('name=echo')
  return {
    index,
    method: route.method,
    path: apiPath + (query.length > 0 ? `?${query.join('&')}` : ''),
    headers,
    body,
    authenticated: true,
    api: true,
    variant: false,
  }
}

/** A multipart/form-data body of text fields and a `file` part. */
function multipart(boundary: string, fields: Record<string, string>, file: Buffer): Buffer {
  const parts = Object.entries(fields).map(
    ([name, value]) => `--${boundary}\r\ncontent-disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`,
  )
  return Buffer.concat([
    Buffer.from(parts.join('')),
    Buffer.from(
      `--${boundary}\r\ncontent-disposition: form-data; name="file"; filename="project.tar.gz"\r\ncontent-type: application/gzip\r\n\r\n`,
    ),
    file,
    Buffer.from(`\r\n--${boundary}--\r\n`),
  ])
}

/** A JSON body the route accepts: its schema's required fields, with the real IDs it names. */
function wellFormedJson(route: Route, rng: Rng, hints: Record<string, unknown[]>): unknown {
  if (route.template.endsWith('/restore') || route.template.endsWith('/fork'))
    return { snapshotId: ids.snapshot }
  // A command that ends at its first byte of stdin, or in 3 s: streams that follow it end.
  if (route.template.endsWith('/commands'))
    return { command: ['sh', '-c', 'head -c 1 >/dev/null'], stdin: true, timeoutMs: 3000 }
  if (route.template.endsWith('/stdin')) return { text: 'fuzzed\n', close: true }
  if (route.template.endsWith('/commands/{commandId}/signal')) return { signal: 'SIGCONT' }
  const schema = route.body as JsonSchema
  const out: Record<string, unknown> = {}
  for (const name of schema.required ?? [])
    out[name] = hints[name]?.[0] ?? fromSchema(rng, schema.properties?.[name] ?? {}, {}, name)
  if (route.template.endsWith('/secrets')) return { secrets: { K2: 'v' } }
  if (route.template === '/v1/webhooks/{id}' && route.method === 'PATCH') return { enabled: true }
  // A run's last message must be the user's, with text (any role or content is a 400).
  if (route.template.endsWith('/ag-ui'))
    return { ...out, messages: [{ id: 'm1', role: 'user', content: 'fuzzed' }] }
  return out
}

interface Samples {
  agent: Buffer
  workspace: Buffer
}

const WRITE_ORDER: Record<string, number> = { GET: 0, PUT: 1, POST: 2, DELETE: 3 }
/** Ending and resuming the session come after its other writes, deleting last. */
function happyOrder(route: Route): number {
  // A command's writes before the workspace's (an import or a restore stops its sandbox).
  if (route.template.includes('/commands/{commandId}/')) return 0.9
  // A signed URL while the service on port 8000 still listens (a turn or a restore replaces the
  // sandbox it runs in).
  if (route.template.endsWith('/ports/{port}/url') && route.method === 'POST') return 0.95
  const last = route.template.endsWith('/end') ? 0.5 : route.template.endsWith('/resume') ? 0.7 : 0
  return (WRITE_ORDER[route.method] ?? 2) + last
}

/** Bodies this large are sent on a connection of their own. */
const BIG_BODY_BYTES = 1024 * 1024

/** Requests that met a kept-alive socket the server had just closed, and were sent again. */
let staleSocketRetries = 0

interface Answer {
  status: number
  type: string
  body: Buffer
  headers: Record<string, string | undefined>
}

function send(request: FuzzRequest, fresh = false): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const headerBytes = Object.values(request.headers).reduce((sum, value) => sum + value.length, 0)
    const big = fresh || (request.body?.length ?? 0) > BIG_BODY_BYTES || headerBytes > 8000
    const req = http.request(
      {
        host: base.hostname,
        port: base.port,
        method: request.method,
        path: request.path,
        // Node's client frames a GET or DELETE body without a length unless told: always tell it.
        headers:
          request.body === undefined
            ? request.headers
            : { ...request.headers, 'content-length': String(request.body.length) },
        // A server may answer a too-large body before reading it and close: keep that off the pool.
        agent: big ? false : agent,
      },
      (res) => {
        const chunks: Buffer[] = []
        res.on('data', (chunk: Buffer) => chunks.push(chunk))
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            type: String(res.headers['content-type'] ?? ''),
            body: Buffer.concat(chunks),
            headers: {
              allow: res.headers.allow,
              'cairn-session-id': res.headers['cairn-session-id'] as string | undefined,
              'cairn-turn-id': res.headers['cairn-turn-id'] as string | undefined,
            },
          }),
        )
        res.on('error', reject)
      },
    )
    req.setTimeout(REQUEST_TIMEOUT_MS, () =>
      req.destroy(new Error(`no answer within ${REQUEST_TIMEOUT_MS} ms`)),
    )
    req.on('error', (error: NodeJS.ErrnoException) => {
      // The keep-alive race every HTTP client meets (Node's docs on `reusedSocket`): a pooled
      // socket the server closed as the request went out. Sent again once, on a new connection.
      if (req.reusedSocket && (error.code === 'ECONNRESET' || error.code === 'EPIPE')) {
        staleSocketRetries++
        send(request, true).then(resolve, reject)
        return
      }
      reject(error)
    })
    req.end(request.body)
  })
}

interface Finding {
  index: number
  what: string
  request: string
  answer: string
}

function judge(request: FuzzRequest, status: number, type: string, body: Buffer): string | undefined {
  const text = body.toString('utf8')
  if (!request.authenticated && request.api && status < 300 && !request.path.includes('openapi.json'))
    return 'an unauthenticated request succeeded'
  if (status >= 500) {
    let code = ''
    try {
      code = String((JSON.parse(text) as { error?: { code?: unknown } }).error?.code)
    } catch {}
    if (!TOLERATED_5XX.has(code)) return `status ${status}`
  }
  if (status >= 400 && request.method !== 'HEAD' && !request.path.startsWith('/assets/')) {
    let parsed: {
      error?: { code?: unknown; message?: unknown; requestId?: unknown }
      code?: unknown
      message?: unknown
      request_id?: unknown
    }
    try {
      parsed = JSON.parse(text)
    } catch {
      return `non-JSON error body (${type})`
    }
    // The compat API answers errors in the hosted product's shape, with the registry's code; what
    // the HTTP parser refuses before any route (408, 431) is in the registry's shape everywhere.
    const compatShaped = request.path.startsWith(`${COMPAT}/`) && status !== 408 && status !== 431
    const error = compatShaped
      ? { code: parsed.code, message: parsed.message, requestId: parsed.request_id }
      : parsed.error
    if (!error || !isErrorCode(error.code)) return 'error body without a registry code'
    if (typeof error.message !== 'string' || error.message === '') return 'error body without a message'
    if (typeof error.requestId !== 'string' || !error.requestId.startsWith('req_'))
      return 'error body without a requestId'
    if (ERROR_CODES[error.code].status !== status) return `code ${error.code} sent with status ${status}`
  }
  return undefined
}

/**
 * The answer to a method the document has no operation for at `pathname`: where the document has
 * the path, 405 with Allow naming its methods (HEAD beside GET), never the router's 404; anywhere
 * else an error. Undefined: as it should be.
 */
function unlistedAnswer(
  conformance: OpenApiConformance,
  method: string,
  pathname: string,
  res: Answer,
): string | undefined {
  const documented = conformance.methodsAt(pathname)
  const where = `conformance: ${method} ${pathname}`
  if (res.status === 405) {
    const expected = [...new Set([...documented, ...(documented.includes('GET') ? ['HEAD'] : [])])].sort()
    return res.headers.allow === expected.join(', ')
      ? undefined
      : `${where} answered 405 with Allow "${res.headers.allow}", the document lists ${expected.join(', ')}`
  }
  if (res.status < 400 || res.status >= 500) return `${where} is in no operation, answered ${res.status}`
  let message = ''
  try {
    const parsed = JSON.parse(res.body.toString('utf8'))
    message = String(parsed.error?.message ?? parsed.message)
  } catch {}
  if (documented.length > 0 && res.status === 404 && message.startsWith('no route for'))
    return `${where}: 404 no route, for a path the document has with ${documented.join(', ')} (405 expected)`
  return undefined
}

describe('request fuzzing', () => {
  it(`answers ${REQUESTS} generated requests over every route with typed errors, no 500, no crash, no stray writes`, async () => {
    const markersBefore = new Set(markersNow())
    const doc = (await fetch(new URL('/v1/openapi.json', base)).then((r) => r.json())) as Parameters<
      typeof routesOf
    >[0]
    const routes = routesOf(doc)
    expect(routes.length).toBeGreaterThan(40)
    const conformance = new OpenApiConformance(doc)
    const samples: Samples = {
      agent: await packDir(`${EXAMPLES}/echo`),
      workspace: Buffer.from(
        await (
          await fetch(new URL(`/v1/sessions/${ids.liveSession}/export`, base), {
            headers: { authorization: `Bearer ${key}` },
          })
        ).arrayBuffer(),
      ),
    }
    const hints: Record<string, unknown[]> = {
      agent: ['echo', ids.agent, 'victim'],
      snapshotId: [ids.snapshot],
      snapshot: [ids.snapshot],
      from: [ids.snapshot, 'revision'],
      prefix: [ids.liveSession.slice(0, 6), 'ses_'],
      path: ['echo.sh', '.cairn', `${FUZZ_MARKER}.txt`, `dir/${FUZZ_MARKER}.txt`],
      status: ['idle', 'completed'],
    }

    const findings: Finding[] = []
    const statuses = new Map<number, number>()
    const perRoute = new Map<string, number>()
    /** Statuses each documented operation answered with. */
    const perOperation = new Map<Operation, Map<number, number>>(
      conformance.operations.map((op) => [op, new Map()]),
    )
    let mismatches = 0
    /** Status, media type and body against the document; a path no operation has must be a 404. */
    const conform = (request: FuzzRequest, res: Answer): string | undefined => {
      const { status, type, body } = res
      const documented = request.path.startsWith('/v1/') || request.path.startsWith(`${COMPAT}/v1/`)
      if (!request.api || request.variant || !documented) return undefined
      const pathname = request.path.split('?')[0] as string
      const op = conformance.match(request.method, pathname)
      // A path or method no operation has: an error (its registry shape is checked by `judge`);
      // a method the document does not list for a path it has is 405, Allow naming its methods.
      if (!op) return unlistedAnswer(conformance, request.method, pathname, res)
      const seen = perOperation.get(op) as Map<number, number>
      seen.set(status, (seen.get(status) ?? 0) + 1)
      const what = conformance.check(op, status, type, body)
      if (what) mismatches++
      return what === undefined ? undefined : `conformance: ${what}`
    }
    const record = (request: FuzzRequest, describe: string, res: Answer) => {
      links.learn(request.method, res.status, res.body, res.headers)
      links.count(request.path, res.status)
      statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
      const routeKey = `${request.method} ${request.path.split('?')[0]?.replace(/\/[^/]*$/, '/…')}`
      perRoute.set(routeKey, (perRoute.get(routeKey) ?? 0) + 1)
      for (const what of [judge(request, res.status, res.type, res.body), conform(request, res)])
        if (what)
          findings.push({
            index: request.index,
            what,
            request: describe,
            answer: res.body.subarray(0, 300).toString('utf8'),
          })
    }
    const describeRequest = (request: FuzzRequest) =>
      `${request.method} ${request.path.slice(0, 300)} ${request.headers['content-type'] ?? ''} body=${request.body?.subarray(0, 200).toString('utf8') ?? ''}`

    // Well-formed requests first, one per operation, in an order that keeps the session usable.
    const happy = [...routes].sort((a, b) => happyOrder(a) - happyOrder(b))
    for (const [n, route] of happy.entries()) {
      const request = wellFormed(-1 - n, route, hints, samples)
      record(request, describeRequest(request), await send(request))
    }
    // A query parameter the document marks required, left out of a well-formed request: refused.
    let withoutRequired = 0
    for (const [n, route] of routes.entries()) {
      for (const param of route.query.filter((q) => q.required)) {
        const request = wellFormed(-1000 - n, route, hints, samples)
        const [pathname, query = ''] = request.path.split('?')
        const rest = query.split('&').filter((part) => part !== '' && !part.startsWith(`${param.name}=`))
        request.path = `${pathname}${rest.length > 0 ? `?${rest.join('&')}` : ''}`
        const res = await send(request)
        record(request, describeRequest(request), res)
        withoutRequired++
        if (res.status < 400)
          findings.push({
            index: request.index,
            what: `conformance: ${route.method} ${route.template} answered ${res.status} without ${param.name}, which the document marks required`,
            request: describeRequest(request),
            answer: res.body.subarray(0, 300).toString('utf8'),
          })
      }
    }
    expect((await api.call('POST', `/v1/sessions/${ids.liveSession}/resume`)).status).toBeLessThan(500)
    const only = process.env.FUZZ_ONLY === undefined ? undefined : Number(process.env.FUZZ_ONLY)
    let next = only ?? 0
    const last = only === undefined ? REQUESTS : only + 1
    const worker = async () => {
      while (next < last) {
        const request = generate(next++, routes, hints)
        const describe = describeRequest(request)
        if (only !== undefined)
          console.log(
            `[fuzz-requests] #${request.index} (${request.body?.length ?? 0} body bytes): ${describe}`,
          )
        try {
          record(request, describe, await send(request))
        } catch (error) {
          // A large body the server refuses without reading it (over the limit: 413; a type the
          // route does not take: 415) may meet the closed connection before it is all written.
          // Such bodies go on their own connection (see `send`), so nothing else is disturbed.
          const code = (error as NodeJS.ErrnoException).code
          if ((code === 'EPIPE' || code === 'ECONNRESET') && (request.body?.length ?? 0) > BIG_BODY_BYTES) {
            statuses.set(-1, (statuses.get(-1) ?? 0) + 1)
            continue
          }
          findings.push({
            index: request.index,
            what: `transport: ${(error as Error).message}`,
            request: describe,
            answer: '',
          })
        }
      }
    }
    await Promise.all(Array.from({ length: CONCURRENCY }, worker))

    console.log(
      `[fuzz-requests] seed ${SEED}: ${last - (only ?? 0)} requests over ${routes.length} routes; statuses ${JSON.stringify(Object.fromEntries([...statuses].sort((a, b) => a[0] - b[0])))}; sent again after a stale kept-alive socket: ${staleSocketRetries}`,
    )
    // One example per kind of finding, so a systematic bug does not drown the rest.
    const kinds = new Map<string, Finding>()
    for (const f of findings) {
      const kind = `${f.what} ${f.answer.replace(/req_[a-z0-9]+/g, '').slice(0, 80)}`
      if (!kinds.has(kind)) kinds.set(kind, f)
    }
    console.log(`[fuzz-requests] ids ${JSON.stringify(ids)}`)
    for (const f of [...kinds.values()].slice(0, 30))
      console.log(
        `[fuzz-requests] FUZZ_SEED=${SEED} FUZZ_ONLY=${f.index}: ${f.what}\n  ${f.request}\n  -> ${f.answer}`,
      )
    if (findings.length > 0) console.log(`[fuzz-requests] server log:\n${serverLog.join('').slice(-20_000)}`)
    const fiveXx = [...statuses].filter(([status]) => status >= 500).reduce((sum, [, n]) => sum + n, 0)
    // A single-process server has no cluster nodes: their routes and session moves cannot succeed
    // here (the cluster tests drive them); they must still be refused typed, which they were
    // (404 for an unknown node, 409 for a move off a server with no other node).
    const clusterOnly = ({ template }: { template: string }) =>
      template.startsWith('/v1/nodes/') || template === '/v1/sessions/{id}/move'
    for (const [op, seen] of perOperation)
      if (clusterOnly(op))
        expect([...seen.keys()].some((status) => status === 404 || status === 409)).toBe(true)
    const neverSucceeded = [...perOperation]
      .filter(([op]) => !clusterOnly(op))
      .filter(([, seen]) => ![...seen.keys()].some((status) => status >= 200 && status < 300))
      .map(([op, seen]) => `${op.method} ${op.template} ${JSON.stringify(Object.fromEntries(seen))}`)
    console.log(
      `[fuzz-requests] report: ${happy.length + withoutRequired + last - (only ?? 0)} requests (${happy.length} well-formed, ${withoutRequired} without a required parameter), ${conformance.operations.length} operations, ${conformance.operations.length - neverSucceeded.length} answered 2xx; links: ${links.counts.learned} IDs made by one operation, ${links.counts.linkedRequests} requests used one, ${links.counts.linkedSuccesses} of them answered 2xx; statuses ${JSON.stringify(Object.fromEntries([...statuses].sort((a, b) => a[0] - b[0])))}; ${mismatches} mismatches with the OpenAPI document; ${fiveXx} 5xx`,
    )
    for (const op of neverSucceeded) console.log(`[fuzz-requests] never answered 2xx: ${op}`)
    expect(findings.map((f) => `#${f.index} ${f.what}`)).toEqual([])
    if (only === undefined) expect(neverSucceeded).toEqual([])
    // Stateful: requests did reach what other requests of the run made.
    if (only === undefined) expect(links.counts.linkedSuccesses).toBeGreaterThan(0)

    // Still the same process, still answering, still serving the session it had.
    expect(child?.exitCode).toBeNull()
    expect(process.kill(serverPid, 0)).toBe(true)
    expect((await fetch(new URL('/healthz', base))).status).toBe(200)
    expect((await api.call('GET', `/v1/sessions/${ids.liveSession}`)).status).toBe(200)
    expect((await api.call('GET', '/v1/agents/echo')).status).toBe(200)

    // Nothing written outside its place: the server's cwd stays empty, its sentinel parent holds
    // only the data dir, no marker-named file appeared anywhere shared, and inside the data dir and
    // the pool marker names exist only inside a workspace (where the file API put them).
    expect(listTree(cwdDir, 5)).toEqual([])
    expect(listTree(sentinel, 1)).toEqual(['cwd', 'data'])
    expect(markersNow().filter((p) => !markersBefore.has(p))).toEqual([])
    expect(listTree(dataDir, 8).filter((p) => p.includes(FUZZ_MARKER))).toEqual([])
    // `idmap/<sandbox>/0` is a running bwrap sandbox's idmapped view of its workspace (its first
    // mapped directory), the same files as the pool's, so a marker the file API put there shows too.
    const strayInPool = listTree(instanceRunDir(dataDir), 4).filter(
      (p) =>
        p.includes(FUZZ_MARKER) &&
        !/^pool\/(sessions|snapshots)\/[a-z]+_[A-Za-z0-9]+\/.+/.test(p) &&
        !/^idmap\/sbx_[a-z0-9]+\/0\/.+/.test(p),
    )
    expect(strayInPool).toEqual([])
  }, 300_000)
})

describe('request cases fuzzing found (regressions)', () => {
  const expectError = (
    res: { status: number; body: { error?: { code?: string; requestId?: string } } },
    status: number,
    code: string,
  ) => {
    expect(res.status, JSON.stringify(res.body)).toBe(status)
    expect(res.body.error?.code).toBe(code)
    expect(res.body.error?.requestId).toMatch(/^req_/)
  }

  it('refuses numbers that coerce to Infinity instead of storing them (which broke every later list)', async () => {
    expectError(
      await api.call('POST', '/v1/sessions', { agent: 'echo', keepWarmMs: 'Infinity' }),
      400,
      'validation_failed',
    )
    expectError(
      await api.call('POST', '/v1/sessions', { agent: 'echo', idleTimeoutMs: '1e400' }),
      400,
      'validation_failed',
    )
    expectError(
      await api.call('PUT', '/v1/retention', { endedWorkspaceTtlMs: '1e400' }),
      400,
      'validation_failed',
    )
    expectError(await api.call('GET', '/v1/sessions?limit=1e400'), 400, 'validation_failed')
    expect((await api.call('GET', '/v1/sessions')).status).toBe(200)
    expect((await api.call('GET', '/v1/retention')).status).toBe(200)
  })

  it("answers the router's own refusals in the registry shape", async () => {
    expectError(await api.call('GET', '/v1/agents/%/secrets'), 400, 'bad_request')
    expectError(await api.call('GET', '/v1/sessions/%c0%ae%zz'), 400, 'bad_request')
    expectError(await api.call('GET', `/v1/sessions/${'z'.repeat(300)}`), 400, 'validation_failed')
    expectError(await api.call('GET', `/v1/sessions/${'z'.repeat(2000)}/files`), 400, 'bad_request')
  })

  it('answers a directory listing of a file with 400', async () => {
    const session = await api.createSession('echo')
    const res = await api.call('GET', `/v1/sessions/${session.id}/files?path=echo.sh`)
    expectError(res, 400, 'validation_failed')
    expect(res.body.error.message).toContain('not a directory')
  })

  it('answers a path with a name longer than the file system allows with 400, wherever the path goes', async () => {
    const session = await api.createSession('echo')
    const long = 'x'.repeat(256)
    for (const res of [
      await api.call('POST', `/v1/sessions/${session.id}/artifacts`, { path: long }),
      await api.call('GET', `/v1/sessions/${session.id}/files/content?path=${long}`),
      await api.call('GET', `/v1/sessions/${session.id}/files?path=${long}`),
      await api.call('GET', `/v1/sessions/${session.id}/files/content?path=dir/${long}/file`),
      await api.call('DELETE', `/v1/sessions/${session.id}/files?path=${long}`),
      await api.call('PUT', `/v1/sessions/${session.id}/files/content?path=${long}`, Buffer.from('bytes'), {
        'content-type': 'application/octet-stream',
      }),
    ]) {
      expectError(res, 400, 'validation_failed')
      expect(res.body.error.message).toContain('longer than 255 bytes')
    }
  })

  it('answers a FIFO in the workspace with 400 instead of blocking a server thread on it', async () => {
    const session = await api.createSession('echo')
    const workspace = path.join(instanceRunDir(dataDir), 'pool', 'sessions', session.id)
    execFileSync('mkfifo', [path.join(workspace, 'pipe')])
    await mkdir(path.join(workspace, '.cairn'), { recursive: true })
    execFileSync('mkfifo', [path.join(workspace, '.cairn', 'memory.proposed.md')])
    // More reads than the server has file-system threads: blocked opens would stall everything.
    // Downloads are heavy reads (2 per tenant at once): the others are refused as rate_limited.
    const reads = await Promise.all(
      Array.from({ length: 6 }, () => api.call('GET', `/v1/sessions/${session.id}/files/content?path=pipe`)),
    )
    const refused = reads.filter((read) => read.status === 400)
    expect(refused.length).toBeGreaterThanOrEqual(2)
    for (const read of refused) expectError(read, 400, 'validation_failed')
    for (const read of reads.filter((r) => r.status !== 400)) expectError(read, 429, 'rate_limited')
    // The slots came back: one after another, every read is refused for what the file is.
    for (let i = 0; i < 6; i++)
      expectError(
        await api.call('GET', `/v1/sessions/${session.id}/files/content?path=pipe`),
        400,
        'validation_failed',
      )
    expectError(
      await api.call('POST', `/v1/sessions/${session.id}/artifacts`, { path: 'pipe' }),
      400,
      'validation_failed',
    )
    expectError(await api.call('POST', `/v1/sessions/${session.id}/memory/promote`), 400, 'validation_failed')
    expect((await api.call('GET', `/v1/sessions/${session.id}/files`)).status).toBe(200)
  })

  it('answers an upload the sandbox stops reading early (its directory is a file) with a typed error', async () => {
    const session = await api.createSession('echo')
    const res = await api.call(
      'PUT',
      `/v1/sessions/${session.id}/files/content?path=echo.sh/below.txt`,
      Buffer.alloc(4 * 1024 * 1024, 1),
      { 'content-type': 'application/octet-stream' },
    )
    expectError(res, 409, 'conflict')
    expect(res.body.error.message).toContain('/workspace/echo.sh is a file, not a directory')
  })

  it('answers file writes that meet a delete of their session with success or 410, never a 500 (found by linked requests)', async () => {
    const seen = new Map<string, number>()
    for (let i = 0; i < 6; i++) {
      const session = await api.createSession('echo')
      const writes = Array.from({ length: 3 }, (_, n) =>
        api.call('PUT', `/v1/sessions/${session.id}/files/content?path=w${n}.txt`, Buffer.alloc(65_536, n), {
          'content-type': 'application/octet-stream',
        }),
      )
      // Deletes a moment later each round, to meet the writes at different points.
      await new Promise((r) => setTimeout(r, 15 * i))
      expect((await api.call('DELETE', `/v1/sessions/${session.id}`)).status).toBe(200)
      for (const res of await Promise.all(writes)) {
        const key = `${res.status} ${res.body?.error?.code ?? ''}`
        seen.set(key, (seen.get(key) ?? 0) + 1)
      }
    }
    console.log(`[fuzz-requests] writes meeting a delete: ${JSON.stringify(Object.fromEntries(seen))}`)
    for (const key of seen.keys()) expect(['200 ', '410 session_deleted']).toContain(key)
  })

  it('lets concurrent deletes of one session all succeed', async () => {
    const session = await api.createSession('echo')
    const answers = await Promise.all(
      Array.from({ length: 4 }, () => api.call('DELETE', `/v1/sessions/${session.id}`)),
    )
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 200])
    expectError(await api.call('GET', `/v1/sessions/${session.id}/files`), 410, 'session_deleted')
  })

  it('answers reads, diffs and exports that meet a restore swapping the workspace with 200 or 409, never state_lost or a 500', async () => {
    const session = await api.createSession('echo')
    const snapshot = (await api.call('POST', `/v1/sessions/${session.id}/snapshots`, {})).body.id as string
    let restoring = true
    const seen = new Map<string, number>()
    const reader = async () => {
      while (restoring) {
        for (const route of [
          'files',
          'files/content?path=echo.sh',
          'diff',
          'export',
          'manifest?sizes=true',
        ]) {
          const res = await api.call('GET', `/v1/sessions/${session.id}/${route}`)
          const key = `${res.status} ${res.body?.error?.code ?? ''}`
          seen.set(key, (seen.get(key) ?? 0) + 1)
        }
        const resumed = await api.call('POST', `/v1/sessions/${session.id}/resume`)
        const key = `${resumed.status} ${resumed.body?.error?.code ?? ''}`
        seen.set(key, (seen.get(key) ?? 0) + 1)
      }
    }
    const readers = Array.from({ length: 4 }, reader)
    for (let i = 0; i < 15; i++) {
      const res = await api.call('POST', `/v1/sessions/${session.id}/restore`, { snapshotId: snapshot })
      expect([200, 409], JSON.stringify(res.body)).toContain(res.status)
    }
    restoring = false
    await Promise.all(readers)
    console.log(`[fuzz-requests] answers during restores: ${JSON.stringify(Object.fromEntries(seen))}`)
    if ([...seen.keys()].some((k) => k.startsWith('5'))) console.log(serverLog.join('').slice(-6000))
    // Four readers export at once: past the tenant's two concurrent exports the answer is the typed,
    // retryable 429 (workspace/heavy-reads.ts), which is not a failure of the swap.
    for (const key of seen.keys()) expect(['200 ', '409 session_busy', '429 rate_limited']).toContain(key)
  })

  it('answers writes that meet a restore with success or 409, and a write that succeeded is kept', async () => {
    const session = await api.createSession('echo')
    const snapshot = (await api.call('POST', `/v1/sessions/${session.id}/snapshots`, {})).body.id as string
    let restoring = true
    const seen = new Map<string, number>()
    const writer = async (n: number) => {
      for (let i = 0; restoring; i++) {
        const path = `w${n}-${i}.txt`
        const put = await api.call(
          'PUT',
          `/v1/sessions/${session.id}/files/content?path=${path}`,
          Buffer.from(`write ${n}.${i}`),
          { 'content-type': 'application/octet-stream' },
        )
        const del = await api.call('DELETE', `/v1/sessions/${session.id}/files?path=${path}`)
        // Gaps between writes, so restores find the session free as well as busy.
        await new Promise((r) => setTimeout(r, 40 * (n + 1)))
        for (const res of [put, del]) {
          const key = `${res.status < 300 ? '2xx' : res.status} ${res.body?.error?.code ?? ''}`
          seen.set(key, (seen.get(key) ?? 0) + 1)
        }
      }
    }
    const writers = Array.from({ length: 3 }, (_, n) => writer(n))
    const restores = new Map<number, number>()
    for (let i = 0; i < 30; i++) {
      await new Promise((r) => setTimeout(r, 10))
      const res = await api.call('POST', `/v1/sessions/${session.id}/restore`, { snapshotId: snapshot })
      restores.set(res.status, (restores.get(res.status) ?? 0) + 1)
      expect([200, 409], JSON.stringify(res.body)).toContain(res.status)
    }
    restoring = false
    await Promise.all(writers)
    console.log(
      `[fuzz-requests] writes during restores: ${JSON.stringify(Object.fromEntries(seen))}, restores ${JSON.stringify(Object.fromEntries(restores))}`,
    )
    if ([...seen.keys()].some((k) => k.startsWith('5'))) console.log(serverLog.join('').slice(-6000))
    for (const key of seen.keys()) expect(['2xx ', '409 session_busy', '404 not_found']).toContain(key)
    // Once nothing races it, a write answered with success is in the workspace.
    const last = await api.call(
      'PUT',
      `/v1/sessions/${session.id}/files/content?path=kept.txt`,
      Buffer.from('kept'),
      {
        'content-type': 'application/octet-stream',
      },
    )
    expect(last.status).toBeLessThan(300)
    expect((await api.call('GET', `/v1/sessions/${session.id}/files/content?path=kept.txt`)).body).toBe(
      'kept',
    )
  })
})
