import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type EgressBed, startEgressBed } from '../helpers/egress-probe.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// One agent that hoards tunnels or floods lookups must not take away another's egress
// (issue 28 items 9, 13, 14, 15), on the egress test bed (test/helpers/egress-probe.ts).
const SUBNET = 228
/** A name only the operator's map (CAIRN_EGRESS_HOSTS) knows. */
const MAPPED_NAME = `svc-${process.pid}.internal`
const MAX_CONNECTIONS = 16
const MAX_LOOKUPS = 8
let bed: EgressBed
let TEST_HOST = ''
let FAST_NAME = ''
let SLOW = ''
let asked: string[] = []
let t: TestServer

beforeAll(async () => {
  bed = await startEgressBed('elim', SUBNET)
  ;({ address: TEST_HOST, fastName: FAST_NAME, slow: SLOW, asked } = bed)
  t = await startTestServer({
    server: {
      egressPrivateExceptions: [TEST_HOST],
      egressHosts: { [MAPPED_NAME]: TEST_HOST },
      egressLimits: {
        maxConnections: MAX_CONNECTIONS,
        maxLookups: MAX_LOOKUPS,
        lookupTimeoutMs: 15_000,
        dnsServers: [bed.dnsServer],
      },
    },
  })
  const project = await makeProject({
    'cairn.yaml': 'name: limits\ncommand: python3 probe.py\n',
    'probe.py': bed.probe,
  })
  expect((await t.api.deploy(project)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
  bed?.close()
})

const session = async (allow: string[]) => (await t.api.createSession('limits', { network: { allow } })).id
const send = async (id: string, line: string) => (await t.api.send(id, line)).text.trim()
const denials = async (id: string) =>
  (await t.api.call('GET', `/v1/sessions/${id}/network`)).body.data
    .filter((e: { allowed: boolean }) => !e.allowed)
    .map((e: { reason: string }) => e.reason) as string[]

describe("one sandbox's egress is bounded and cannot take another's", () => {
  it('answers a tunnel hoarder 429 past its cap, and leaves the server and another session egress', async () => {
    const hoarder = await session([`${TEST_HOST}:8443`])
    const other = await session([`${TEST_HOST}:8443`, `${TEST_HOST}:8080`])
    // Every tunnel held open: those past the cap are refused with a clear answer.
    expect(await send(hoarder, `hoard ${MAX_CONNECTIONS + 8} ${TEST_HOST}:8443`)).toBe(
      `200 x${MAX_CONNECTIONS} 429 x8`,
    )
    expect(await send(hoarder, `connect ${TEST_HOST}:8443`)).toBe('HTTP/1.1 429 Too Many Requests')
    // The other session's tunnels and proxied requests go on, and the server answers.
    expect(await send(other, `connect ${TEST_HOST}:8443`)).toBe('HTTP/1.1 200 Connection Established')
    expect(await send(other, `get http://${TEST_HOST}:8080/x`)).toBe(
      `hello from the test host: ${TEST_HOST}:8080 /x`,
    )
    expect((await t.api.call('GET', '/healthz')).status).toBe(200)
    // Closing its tunnels gives the hoarder its egress back.
    expect(await send(hoarder, 'release')).toBe('released')
    // (once the proxy has seen them close, through the forwarder)
    let again = ''
    for (let i = 0; i < 50 && !again.endsWith(' 200 Connection Established'); i++) {
      await new Promise((r) => setTimeout(r, 100))
      again = await send(hoarder, `connect ${TEST_HOST}:8443`)
    }
    expect(again).toBe('HTTP/1.1 200 Connection Established')
    expect(await denials(hoarder)).toContain(`too many egress connections at once (limit ${MAX_CONNECTIONS})`)
  })

  it("keeps one sandbox's lookups that DNS never answers from holding up another's", async () => {
    const flooder = await session([`*.${SLOW}:8443`])
    const other = await session([`${FAST_NAME}:8443`])
    expect(await send(flooder, `flood ${MAX_LOOKUPS + 4}`)).toBe('started')
    const slowNames = () => new Set(asked.filter((name) => name.endsWith(SLOW))).size
    for (let i = 0; i < 100 && slowNames() < MAX_LOOKUPS; i++) await new Promise((r) => setTimeout(r, 50))
    // The other sandbox's name is asked and answered while all of the flooder's wait on DNS,
    // and the flooder never has more than its cap of lookups out.
    expect(await send(other, `connect ${FAST_NAME}:8443`)).toBe('HTTP/1.1 200 Connection Established')
    expect(slowNames()).toBe(MAX_LOOKUPS)
    expect(await send(flooder, 'answered')).toBe('0')
  })

  it("sends a name with a trailing dot to the operator's map, like the name without it", async () => {
    const id = await session([`${MAPPED_NAME}:8080`, `${MAPPED_NAME}:8443`])
    expect(await send(id, `get http://${MAPPED_NAME}.:8080/x`)).toBe(
      `hello from the test host: ${MAPPED_NAME}.:8080 /x`,
    )
    expect(await send(id, `connect ${MAPPED_NAME.toUpperCase()}.:8443`)).toBe(
      'HTTP/1.1 200 Connection Established',
    )
    expect(asked.filter((name) => name.startsWith(MAPPED_NAME))).toEqual([])
  })

  it("sends each plain HTTP request in a tunnel to the tunnel's host, and closes one that starts with an SSLv2 ClientHello", async () => {
    const id = await session([`${MAPPED_NAME}:8080`, `${TEST_HOST}:8443`])
    // The pipelined second request names another site: it goes to the tunnel's host as that host.
    const host = `${MAPPED_NAME}:8080`
    expect(await send(id, `pipelined ${host}`)).toBe(
      `HTTP/1.1 200 Connection Established | HTTP/1.1 200 | hello from the test host: ${host} /one | HTTP/1.1 200 | hello from the test host: ${host} /two`,
    )
    // Closed before a byte reaches the host: no echo of the hello.
    expect(await send(id, `sslv2 ${TEST_HOST}:8443`)).toBe('HTTP/1.1 200 Connection Established | closed')
    expect(await denials(id)).toEqual([
      'unreadable start of the connection (an SSLv2-format ClientHello, which names no server)',
    ])
  })
})
