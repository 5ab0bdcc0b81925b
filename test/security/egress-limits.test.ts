import type { ChildProcess } from 'node:child_process'
import dgram from 'node:dgram'
import net from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createNetnsHost, type NetnsHost, netnsAddresses } from '../helpers/netns.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// One agent that hoards tunnels or floods lookups must not take away another's egress
// (issue 28 items 9, 13, 14, 15). A test host in its own namespace answers HTTP on 8080 with the
// Host and path it was asked for, and echoes on 8443 (keeping every connection open); a DNS
// server on loopback answers one name and never answers the names under SLOW.
const SUBNET = 228
const { address: TEST_HOST } = netnsAddresses(SUBNET)
const FAST_NAME = `fast-${process.pid}.cairn.test`
const SLOW = `slow-${process.pid}.cairn.test`
/** A name only the operator's map (CAIRN_EGRESS_HOSTS) knows. */
const MAPPED_NAME = `svc-${process.pid}.internal`
const MAX_CONNECTIONS = 16
const MAX_LOOKUPS = 8
let netnsHost: NetnsHost | undefined
let web: ChildProcess | undefined
let dns: dgram.Socket | undefined
/** Every name the DNS server was asked for, in order. */
const asked: string[] = []
let t: TestServer

/** Whether the test host's `port` takes connections yet. */
const reachable = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = net.connect(port, TEST_HOST)
    socket.once('connect', () => {
      socket.destroy()
      resolve(true)
    })
    socket.once('error', () => resolve(false))
  })

/** The question's name of a DNS query, and an answer: FAST_NAME's A record, NXDOMAIN, or none. */
function answerQuery(query: Buffer): { name: string; reply: Buffer | undefined } {
  const labels: string[] = []
  let at = 12
  while (at < query.length && query[at] !== 0) {
    const length = query[at] ?? 0
    labels.push(query.subarray(at + 1, at + 1 + length).toString('latin1'))
    at += 1 + length
  }
  const name = labels.join('.').toLowerCase()
  const questionEnd = at + 5
  const type = query.readUInt16BE(at + 1)
  if (name.endsWith(SLOW)) return { name, reply: undefined }
  const found = name === FAST_NAME && type === 1
  const header = Buffer.alloc(12)
  query.copy(header, 0, 0, 2)
  header.writeUInt16BE(found || name === FAST_NAME ? 0x8180 : 0x8183, 2)
  header.writeUInt16BE(1, 4)
  header.writeUInt16BE(found ? 1 : 0, 6)
  const record = Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, ...TEST_HOST.split('.').map(Number)])
  return {
    name,
    reply: Buffer.concat([header, query.subarray(12, questionEnd), found ? record : Buffer.alloc(0)]),
  }
}

beforeAll(async () => {
  netnsHost = createNetnsHost('elim', SUBNET)
  web = netnsHost.spawn(
    [
      process.execPath,
      '-e',
      `require("net").createServer((s) => s.pipe(s)).listen(8443, "${TEST_HOST}")
       require("http").createServer((req, res) => res.end("hello from the test host: " + req.headers.host + " " + req.url + "\\n")).listen(8080, "${TEST_HOST}")`,
    ],
    { stdio: 'ignore' },
  )
  for (let i = 0; i < 100 && !(await reachable(8080)); i++) await new Promise((r) => setTimeout(r, 50))
  dns = dgram.createSocket('udp4')
  dns.on('message', (query, peer) => {
    const { name, reply } = answerQuery(query)
    asked.push(name)
    if (reply) dns?.send(reply, peer.port, peer.address)
  })
  await new Promise<void>((resolve) => dns?.bind(0, '127.0.0.1', resolve))
  t = await startTestServer({
    server: {
      egressPrivateExceptions: [TEST_HOST],
      egressHosts: { [MAPPED_NAME]: TEST_HOST },
      egressLimits: {
        maxConnections: MAX_CONNECTIONS,
        maxLookups: MAX_LOOKUPS,
        lookupTimeoutMs: 15_000,
        dnsServers: [`127.0.0.1:${dns.address().port}`],
      },
    },
  })
  const probe = [
    'import re, socket, threading, urllib.request',
    'held = []',
    'flood = []',
    // A CONNECT through the sandbox's proxy, then `payload`; the status line and what came back.
    'def connect(target, payload=b"", keep=False, timeout=5):',
    '    try:',
    '        s = socket.create_connection(("127.0.0.1", 3128), timeout=timeout)',
    '        s.sendall(("CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, target)).encode())',
    '        reply = s.recv(4096).decode(errors="replace")',
    '        status = reply.split("\\r\\n")[0] if reply else "ERR closed"',
    '        if keep: held.append(s); return status',
    '        if payload and status.endswith(" 200 Connection Established"):',
    '            s.sendall(payload)',
    '            s.settimeout(2)',
    '            back = b""',
    '            try:',
    '                while True:',
    '                    chunk = s.recv(4096)',
    '                    if not chunk: break',
    '                    back += chunk',
    '            except Exception: pass',
    '            seen = re.findall(r"HTTP/1\\.[01] \\d+|hello from the test host: \\S+ \\S+", back.decode(errors="replace"))',
    '            status += " | " + (" | ".join(seen) if seen else "closed")',
    '        s.close()',
    '        return status',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    'def get(url):',
    '    try:',
    '        return urllib.request.urlopen(url, timeout=5).read().decode().strip()',
    '    except Exception as e:',
    '        return "ERR " + str(e)[:80]',
    'def hoard(n, target):',
    '    codes = [connect(target, keep=True).split(" ")[1] for _ in range(n)]',
    '    return " ".join("%s x%d" % (c, codes.count(c)) for c in sorted(set(codes)))',
    'def start_flood(n):',
    '    for i in range(n):',
    '        threading.Thread(target=lambda i=i: flood.append(connect("n%d.' +
      SLOW +
      ':8443" % i, timeout=None)), daemon=True).start()',
    '    return "started"',
    'while True:',
    '    kind, _, arg = input().partition(" ")',
    '    if kind == "connect": print(connect(arg))',
    '    elif kind == "get": print(get(arg))',
    '    elif kind == "hoard": n, target = arg.split(" "); print(hoard(int(n), target))',
    '    elif kind == "release": [s.close() for s in held]; held.clear(); print("released")',
    '    elif kind == "flood": print(start_flood(int(arg)))',
    '    elif kind == "answered": print(len(flood))',
    '    elif kind == "pipelined": print(connect(arg, ("GET /one HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % arg + "GET /two HTTP/1.1\\r\\nHost: evil.example\\r\\nConnection: close\\r\\n\\r\\n").encode()))',
    // An SSLv2-format ClientHello: a two-byte length with the high bit, type 1, version 3.1.
    '    elif kind == "sslv2": print(connect(arg, bytes([0x80, 0x2e, 0x01, 0x03, 0x01, 0, 0x15, 0, 0, 0, 0x10]) + bytes(0x2e - 9)))',
  ].join('\n')
  const project = await makeProject({
    'cairn.yaml': 'name: limits\ncommand: python3 probe.py\n',
    'probe.py': probe,
  })
  expect((await t.api.deploy(project)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
  dns?.close()
  web?.kill('SIGKILL')
  netnsHost?.remove()
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
