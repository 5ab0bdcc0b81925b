import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { instanceRunDir } from '@cairn/runtime'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { FUZZ_MARKER, listTree, markerEntries, SHARED_PLACES, type SharedPlaces } from '../helpers/fuzz.js'
import {
  type Answer,
  BIG_BODY_BYTES,
  type Finding,
  FuzzClient,
  judge,
  unlistedAnswer,
} from '../helpers/fuzz-request-client.js'
import {
  COMPAT,
  type FuzzRequest,
  generate,
  happyOrder,
  ids,
  keys,
  links,
  routesOf,
  type Samples,
  SEED,
  wellFormed,
} from '../helpers/fuzz-request-ops.js'
import { buildWorld } from '../helpers/fuzz-request-world.js'
import { runTerminal, TERMINAL_COMMANDS, terminalStep } from '../helpers/fuzz-terminal.js'
import { OpenApiConformance, type Operation } from '../helpers/openapi-conformance.js'
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

const REQUESTS = Number(process.env.FUZZ_REQUESTS ?? 10_000)
const CONCURRENCY = 8
const FIXTURE = path.join(REPO_ROOT, 'test/fixtures/server-process.mjs')
let sentinel = ''
let dataDir = ''
let cwdDir = ''
let child: ChildProcess | undefined
let serverPid = 0
let base: URL
let key = ''
let api: Api
const serverLog: string[] = []
let client: FuzzClient
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
  client = new FuzzClient(base, CONCURRENCY)
  key = (await readFile(path.join(dataDir, 'admin.key'), 'utf8')).trim()
  keys.admin = key
  api = new Api(started.url, key)

  await buildWorld(api)
}, 120_000)

afterAll(async () => {
  client?.close()
  if (child && child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((resolve) => child?.once('exit', resolve))
    child.kill('SIGTERM')
    await exited
  }
  if (sentinel) await rm(sentinel, { recursive: true, force: true })
})

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

    // A single-process server has no cluster nodes: their routes and session moves cannot succeed
    // here (the cluster tests drive them); they must still be refused typed, which they were
    // (404 for an unknown node, 409 for a move off a server with no other node).
    const clusterOnly = ({ template }: { template: string }) =>
      template.startsWith('/v1/nodes/') || template === '/v1/sessions/{id}/move'
    // Well-formed requests first, one per operation, in an order that keeps the session usable.
    // A refusal is sent again (up to 3 more times, a second apart): on a loaded machine a turn or a
    // command of an earlier request may still hold the session. Every answer is judged.
    const happy = [...routes].sort((a, b) => happyOrder(a) - happyOrder(b))
    const happyRefusals: string[] = []
    for (const [n, route] of happy.entries()) {
      for (let attempt = 0; ; attempt++) {
        const request = wellFormed(-1 - n, route, hints, samples)
        const res = await client.send(request)
        record(request, describeRequest(request), res)
        if (res.status < 300 || clusterOnly(route) || attempt === 3) break
        happyRefusals.push(`${route.method} ${route.template}: ${res.status} ${res.body.subarray(0, 200)}`)
        await new Promise((resolve) => setTimeout(resolve, 1000))
      }
    }
    for (const refusal of happyRefusals) console.log(`[fuzz-requests] well-formed, refused: ${refusal}`)
    // A query parameter the document marks required, left out of a well-formed request: refused.
    let withoutRequired = 0
    for (const [n, route] of routes.entries()) {
      for (const param of route.query.filter((q) => q.required)) {
        const request = wellFormed(-1000 - n, route, hints, samples)
        const [pathname, query = ''] = request.path.split('?')
        const rest = query.split('&').filter((part) => part !== '' && !part.startsWith(`${param.name}=`))
        request.path = `${pathname}${rest.length > 0 ? `?${rest.join('&')}` : ''}`
        const res = await client.send(request)
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
          record(request, describe, await client.send(request))
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
      `[fuzz-requests] seed ${SEED}: ${last - (only ?? 0)} requests over ${routes.length} routes; statuses ${JSON.stringify(Object.fromEntries([...statuses].sort((a, b) => a[0] - b[0])))}; sent again after a stale kept-alive socket: ${client.staleSocketRetries}`,
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
    if (only === undefined)
      expect(
        neverSucceeded,
        `never answered 2xx: ${neverSucceeded.join('; ')}; well-formed, refused: ${happyRefusals.join('; ')}`,
      ).toEqual([])
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

describe('terminal socket fuzzing', () => {
  // Every message kind of the terminal socket (stdin, resize, signal, close) in every wrong form
  // and order, and frames the protocol forbids, on each kind of command: no `internal` error, no
  // 1011 close, and the server (its own process) answers after each. A frame past the payload
  // bound or a protocol error was thrown out of the socket's error event: the process died.
  it('answers generated terminal messages with typed errors or protocol closes, never a crash', async () => {
    const session = (await api.createSession('echo')).id
    const wsBase = base.href.replace(/^http/, 'ws').replace(/\/$/, '')
    const closes = new Map<number, number>()
    await fc.assert(
      fc.asyncProperty(
        fc.nat({ max: TERMINAL_COMMANDS.length - 1 }),
        fc.array(terminalStep, { minLength: 1, maxLength: 6 }),
        async (which, steps) => {
          const started = await api.call('POST', `/v1/sessions/${session}/commands`, TERMINAL_COMMANDS[which])
          expect(started.status, JSON.stringify(started.body)).toBe(201)
          const path = `/v1/sessions/${session}/commands/${started.body.id}/terminal`
          const run = await runTerminal(`${wsBase}${path}`, key, steps)
          closes.set(run.closeCode ?? 0, (closes.get(run.closeCode ?? 0) ?? 0) + 1)
          expect(run.wrong).toEqual([])
          expect(run.closeCode).not.toBe(1011)
          expect(child?.exitCode, serverLog.join('').slice(-4000)).toBeNull()
          expect((await fetch(new URL('/healthz', base))).status).toBe(200)
          await api.call('POST', `/v1/sessions/${session}/commands/${started.body.id}/signal`, {
            signal: 'SIGKILL',
          })
        },
      ),
      { numRuns: 24, seed: SEED, endOnFailure: true },
    )
    console.log(
      `[fuzz-requests] terminal sockets' close codes: ${JSON.stringify(Object.fromEntries(closes))}`,
    )
    expect((await api.call('DELETE', `/v1/sessions/${session}`)).status).toBe(200)
  }, 120_000)
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
