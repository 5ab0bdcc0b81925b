import {
  deepJson,
  FUZZ_MARKER,
  fromSchema,
  fuzzJson,
  fuzzSeed,
  fuzzString,
  type JsonSchema,
  mutate,
  pollutedJson,
  Rng,
  traversal,
} from './fuzz.js'
import { LinkPool } from './fuzz-links.js'

// The operation table of test/security/fuzz-requests.test.ts: the routes of the OpenAPI document
// and, for each generated request, its method, path (real, linked, hostile or rewritten
// parameters), query, headers and body; the well-formed request of each route that must reach a
// success. The run itself (the server, the workers, what is checked) is in the test file, the
// sending and judging in fuzz-request-client.ts.

export const SEED = fuzzSeed('fuzz-requests', 0x5eed_0006)
/** The compat API's prefix (`--compat-prefix`): its routes are in the document and fuzzed too. */
export const COMPAT = '/superserve'
export const isCompat = (template: string) => template.startsWith(`${COMPAT}/`)
/** A route's template as the native API spells it (the compat prefix taken off). */
export const local = (template: string) => (isCompat(template) ? template.slice(COMPAT.length) : template)

export interface Route {
  method: string
  template: string
  query: { name: string; schema: JsonSchema; required: boolean }[]
  body: JsonSchema | undefined
  /** The request body's media types the operation documents. */
  bodyTypes: string[]
}

export interface FuzzRequest {
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

/** The IDs successful requests handed out, fed to later requests (see LinkPool). */
export const links = new LinkPool()

/** The real IDs the run made before it starts (beforeAll fills them in). */
export const ids = {
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
  /** A command on a terminal: the one `…/resize` is well-formed for (a plain one's is refused 409). */
  terminalCommand: '',
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
export const WEBHOOK = { url: 'https://93.184.215.14/fuzz', events: ['session.node_lost'] }

/** The API keys the run sends (admin, and one that may only read); beforeAll sets them. */
export const keys = { admin: '', read: '' }

export function routesOf(doc: { paths: Record<string, Record<string, Record<string, unknown>>> }): Route[] {
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
  commandId: () => [ids.command, ids.terminalCommand, ids.endedCommand],
  approvalId: () => [ids.approval],
  port: () => ['8000', '3000'],
  key: () => ['K2', 'K1'],
}

/** The command a well-formed request to a command's route names: ended, on a terminal, or plain. */
function commandFor(template: string): string {
  if (template.endsWith('/output')) return ids.endedCommand
  return template.endsWith('/resize') ? ids.terminalCommand : ids.command
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
  if (name === 'commandId') return commandFor(route.template)
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

export function generate(index: number, routes: Route[], hints: Record<string, unknown[]>): FuzzRequest {
  const rng = new Rng((SEED + Math.imul(index, 0x9e3779b1)) >>> 0)
  const headers: Record<string, string> = {}
  let authenticated = true
  const authRoll = rng.next()
  if (authRoll < 0.03) authenticated = false
  else if (authRoll < 0.05) {
    headers.authorization = rng.pick([
      `Bearer ${keys.admin}x`,
      `Basic ${keys.admin}`,
      'Bearer',
      `Bearer  ${fuzzString(rng, { maxHuge: 200 }).replace(/[^\x21-\x7e]/g, '')}`,
    ])
    authenticated = false
  } else if (authRoll < 0.08) {
    // A key that may read but not write: its refusals (403) must be documented too.
    headers.authorization = `Bearer ${keys.read}`
  }
  if (authenticated) headers.authorization ??= `Bearer ${keys.admin}`

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
export function wellFormed(
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
  const headers: Record<string, string> = { authorization: `Bearer ${keys.admin}` }
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

export interface Samples {
  agent: Buffer
  workspace: Buffer
}

const WRITE_ORDER: Record<string, number> = { GET: 0, PUT: 1, POST: 2, DELETE: 3 }
/** Ending and resuming the session come after its other writes, deleting last. */
export function happyOrder(route: Route): number {
  // A command's writes before the workspace's (an import or a restore stops its sandbox).
  if (route.template.includes('/commands/{commandId}/')) return 0.9
  // A signed URL while the service on port 8000 still listens (a turn or a restore replaces the
  // sandbox it runs in).
  if (route.template.endsWith('/ports/{port}/url') && route.method === 'POST') return 0.95
  const last = route.template.endsWith('/end') ? 0.5 : route.template.endsWith('/resume') ? 0.7 : 0
  return (WRITE_ORDER[route.method] ?? 2) + last
}
