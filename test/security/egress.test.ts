import type { ChildProcess } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createNetnsHost, type NetnsHost, netnsAddresses, serveDirectory } from '../helpers/netns.js'
import { previewFetch, previewOrigin } from '../helpers/preview.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// A test host in its own network namespace, reachable from the host over a veth pair.
const SUBNET = 231
const { hostSide: HOST_SIDE, address: TEST_HOST } = netnsAddresses(SUBNET)
// A name for the test host, known to this server's egress proxy alone (its `egressHosts` map).
const TEST_NAME = `egress-${process.pid}.cairn.test`
// A name the operator maps to the host's loopback, spelled as an IPv4-mapped IPv6 address.
const LOOPBACK_NAME = `loopback-${process.pid}.cairn.test`
let netnsHost: NetnsHost | undefined
let web: ChildProcess | undefined
/** A test host's server that says `Connection: keep-alive`, as most SSE handlers do. */
let keepAliveWeb: ChildProcess | undefined
const KEEP_ALIVE_PORT = 8082
let webRoot = ''
let t: TestServer
let hostLoopback: http.Server
let hostLoopbackPort = 0
/** Listens on every address of the host (dual-stack): what the host's own addresses reach. */
let hostAny: http.Server
let hostAnyPort = 0

beforeAll(async () => {
  netnsHost = createNetnsHost('egress', SUBNET)
  webRoot = await mkdtemp(path.join(os.tmpdir(), 'cairn-egress-web-'))
  await writeFile(path.join(webRoot, 'hello.txt'), 'hello from the test host\n')
  web = await serveDirectory(netnsHost, webRoot, 'hello.txt')
  keepAliveWeb = netnsHost.spawn(
    [
      process.execPath,
      '-e',
      `require("http").createServer((req, res) => {
         res.writeHead(200, { connection: "keep-alive", "keep-alive": "timeout=30", "content-length": req.url.length + 4 })
         res.end("ok " + req.url + "\\n")
       }).listen(${KEEP_ALIVE_PORT}, "${TEST_HOST}")`,
    ],
    { stdio: 'ignore' },
  )
  hostLoopback = http.createServer((_req, res) => res.end('host loopback secret\n'))
  await new Promise<void>((resolve) => hostLoopback.listen(0, '127.0.0.1', resolve))
  hostLoopbackPort = (hostLoopback.address() as AddressInfo).port

  hostAny = http.createServer((_req, res) => res.end('host any-address secret\n'))
  await new Promise<void>((resolve) => hostAny.listen(0, '::', resolve))
  hostAnyPort = (hostAny.address() as AddressInfo).port

  t = await startTestServer({
    server: {
      egressPrivateExceptions: [TEST_HOST],
      egressHosts: { [TEST_NAME]: TEST_HOST, [LOOPBACK_NAME]: '0:0:0:0:0:ffff:7f00:1' },
    },
  })
  const probe = [
    'import socket, subprocess, sys, urllib.request',
    'def get(url):',
    '    try:',
    '        return urllib.request.urlopen(url, timeout=3).read().decode().strip()',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__ + " " + str(e)[:80]',
    // A raw HTTP request over a plain socket: no proxy involved.
    'def raw(host, port):',
    '    try:',
    '        s = socket.create_connection((host, port), timeout=3)',
    '        s.sendall(b"GET /hello.txt HTTP/1.0\\r\\n\\r\\n")',
    '        reply = s.recv(4096).decode(errors="replace")',
    '        s.close()',
    '        return reply.split("\\r\\n")[0] if reply else "ERR closed"',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    // The start of a TLS handshake over a plain socket: goes out as a tunnel, not as HTTP.
    'def tls(host, port):',
    '    try:',
    '        s = socket.create_connection((host, port), timeout=3)',
    '        s.sendall(bytes([22, 3, 1, 0, 5]) + b"hello")',
    '        reply = s.recv(4096)',
    '        s.close()',
    '        return "REPLY %d bytes" % len(reply) if reply else "ERR closed"',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    // A command run with the proxy variables unset (programs that ignore them).
    'def run(command):',
    '    unset = ["-u", "HTTP_PROXY", "-u", "http_proxy", "-u", "HTTPS_PROXY", "-u", "https_proxy"]',
    '    done = subprocess.run(["env", *unset, "sh", "-c", command], capture_output=True, text=True, timeout=20)',
    '    return (done.stdout + done.stderr).strip() + " [exit %d]" % done.returncode',
    'def dns(name):',
    '    try:',
    '        return socket.getaddrinfo(name, 443)[0][4][0]',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    // A CONNECT through the explicit proxy: the proxy's answer's status line.
    'def connect(target):',
    '    try:',
    '        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)',
    '        s.sendall(("CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, target)).encode())',
    '        reply = s.recv(4096).decode(errors="replace")',
    '        s.close()',
    '        return reply.split("\\r\\n")[0] if reply else "ERR closed"',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    'while True:',
    '    line = input()',
    '    kind, _, arg = line.partition(" ")',
    '    if kind == "get": print(get(arg))',
    '    elif kind == "raw": h, p = arg.split(":"); print(raw(h, int(p)))',
    '    elif kind == "dns": print(dns(arg))',
    '    elif kind == "tls": h, p = arg.split(":"); print(tls(h, int(p)))',
    '    elif kind == "run": print(run(arg).replace("\\n", " | "))',
    '    elif kind == "connect": print(connect(arg))',
  ].join('\n')
  for (const [name, network] of [
    ['allowed', `network:\n  allow: ["${TEST_HOST}:8080", "${TEST_NAME}:8080"]\n`],
    ['closed', ''],
  ] as const) {
    const project = await makeProject({
      'cairn.yaml': `name: ${name}\ncommand: python3 probe.py\n${network}`,
      'probe.py': probe,
    })
    expect((await t.api.deploy(project)).status).toBe(201)
  }
})

/** `host:port`, an IPv6 address in brackets. */
const authority = (host: string, port: number) =>
  host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`

afterAll(async () => {
  await t?.close()
  hostLoopback?.close()
  hostAny?.close()
  web?.kill('SIGKILL')
  keepAliveWeb?.kill('SIGKILL')
  netnsHost?.remove()
  if (webRoot) await rm(webRoot, { recursive: true, force: true })
})

describe('egress is denied unless allowed', () => {
  it('lets an allowed agent reach its host, and nothing else', async () => {
    const { id } = await t.api.createSession('allowed')
    expect((await t.api.send(id, `get http://${TEST_HOST}:8080/hello.txt`)).text).toBe(
      'hello from the test host\n',
    )
    // Through the proxy: the host side of the veth (private) and the host's loopback are refused.
    expect((await t.api.send(id, `get http://${HOST_SIDE}:8080/`)).text).toContain('403')
    expect((await t.api.send(id, `get http://127.0.0.1:${hostLoopbackPort}/`)).text).toMatch(/^ERR/)
    expect((await t.api.send(id, 'get http://169.254.169.254/latest/meta-data/')).text).toContain('403')
    expect((await t.api.send(id, 'get http://example.com/')).text).toContain('403')
    // Without the proxy variables: every connection is redirected to the same proxy.
    expect((await t.api.send(id, `raw ${TEST_HOST}:8080`)).text).toMatch(/^HTTP\/1\.[01] 200 OK\n$/)
    expect((await t.api.send(id, `raw ${HOST_SIDE}:22`)).text).toBe('HTTP/1.1 403 Forbidden\n')
    expect((await t.api.send(id, `tls ${HOST_SIDE}:22`)).text).toMatch(/^ERR/)
    expect((await t.api.send(id, 'dns example.com')).text).toMatch(/^ERR/)
    const log = await t.api.call('GET', `/v1/sessions/${id}/network`)
    const decisions = log.body.data.map((e: { host: string; allowed: boolean }) => `${e.host}:${e.allowed}`)
    expect(decisions).toContain(`${TEST_HOST}:true`)
    expect(decisions).toContain(`${HOST_SIDE}:false`)
    expect(decisions).toContain('169.254.169.254:false')
    expect(decisions).toContain('example.com:false')
  })

  it("refuses the host's loopback and own addresses in every spelling, even when the allowlist names them", async () => {
    const apiPort = Number(new URL(t.url).port)
    // The control API listens on 127.0.0.1: each spelling of a loopback address, as a CONNECT target.
    const loopback = [
      '127.0.0.1',
      '127.1',
      '127.0.1',
      '0x7f.1',
      '0x7f000001',
      '2130706433',
      '017700000001',
      '0177.0.0.1',
      '127.000.000.001',
      '0',
      '0.0.0.0',
      '::1',
      '::0:1',
      '0:0:0:0:0:0:0:1',
      '::',
      '::ffff:127.0.0.1',
      '0:0:0:0:0:ffff:127.0.0.1',
      '::127.0.0.1',
      '0::ffff:7f00:1',
      '::ffff:7f00:1',
      '::ffff:0:7f00:1',
      '::7f00:1',
      '64:ff9b::7f00:1',
      '2002:7f00:1::1',
      'localhost',
      LOOPBACK_NAME,
    ]
    // Every address of the host's own interfaces (link-local ones need a zone to be reached).
    const own = Object.values(os.networkInterfaces())
      .flat()
      .map((info) => info?.address ?? '')
      .filter((address) => address && !address.startsWith('fe80:'))
    const targets = [
      ...loopback.map((host) => ({ host, port: apiPort })),
      ...own.map((host) => ({ host, port: hostAnyPort })),
    ]
    expect(own.length).toBeGreaterThan(2)
    const { id } = await t.api.createSession('closed', {
      network: { allow: targets.map(({ host, port }) => authority(host, port)) },
    })
    const answers: string[] = []
    for (const { host, port } of targets) {
      const target = authority(host, port)
      answers.push(`${target} ${(await t.api.send(id, `connect ${target}`)).text.trim()}`)
    }
    expect(answers).toEqual(
      targets.map(({ host, port }) => `${authority(host, port)} HTTP/1.1 403 Forbidden`),
    )
    const log = await t.api.call('GET', `/v1/sessions/${id}/network`)
    expect(log.body.data.filter((e: { allowed: boolean }) => e.allowed)).toEqual([])
  })

  it('gives an agent without an allowlist loopback only', async () => {
    const { id } = await t.api.createSession('closed')
    expect((await t.api.send(id, `get http://${TEST_HOST}:8080/hello.txt`)).text).toMatch(/^ERR/)
    expect((await t.api.send(id, `raw ${TEST_HOST}:8080`)).text).toMatch(/^ERR/)
    expect((await t.api.send(id, `raw 127.0.0.1:${hostLoopbackPort}`)).text).toMatch(/^ERR/)
    expect((await t.api.send(id, 'dns example.com')).text).toMatch(/^ERR/)
  })

  it('takes a per-session allowlist over the agent one', async () => {
    const { id } = await t.api.createSession('closed', { network: { allow: [`${TEST_HOST}:8080`] } })
    expect((await t.api.send(id, `get http://${TEST_HOST}:8080/hello.txt`)).text).toBe(
      'hello from the test host\n',
    )
  })

  it('redirects every TCP connection and DNS query of the sandbox to the proxy when programs ignore the proxy variables', async () => {
    const { id } = await t.api.createSession('allowed')
    const run = async (command: string) => (await t.api.send(id, `run ${command}`)).text.trim()
    // Names: the stub answers allowed ones with a stand-in address, and nothing else.
    expect(await run(`getent hosts ${TEST_NAME}`)).toMatch(/^198\.1[89]\.\d+\.\d+\s+egress-.*\[exit 0\]$/)
    expect(await run('getent hosts not-allowed.example')).toBe('[exit 2]')
    const url = `http://${TEST_NAME}:8080/hello.txt`
    expect(
      await run(
        `python3 -c 'import urllib.request; print(urllib.request.urlopen("${url}").read().decode())'`,
      ),
    ).toBe('hello from the test host [exit 0]')
    // Node 20's fetch reads no proxy variable at all.
    expect(
      await run(`node -e 'fetch("${url}").then((r) => r.text()).then((t) => process.stdout.write(t))'`),
    ).toBe('hello from the test host [exit 0]')
    // The rules belong to the host's root: the sandbox can neither read nor change them.
    expect(await run('/usr/sbin/nft flush ruleset')).toMatch(/Operation not permitted.*\[exit 1\]$/)
    expect(await run('/usr/sbin/ip route del default')).toMatch(/Operation not permitted.*\[exit 2\]$/)
    // Raw connections (plain HTTP, or a TLS start that is tunnelled): allowed to the allowlist's
    // hosts, refused to the host's loopback, private, metadata and other addresses, as through
    // the proxy variables.
    expect((await t.api.send(id, `raw ${TEST_NAME}:8080`)).text).toMatch(/^HTTP\/1\.[01] 200 OK\n$/)
    expect((await t.api.send(id, `raw ${TEST_HOST}:8080`)).text).toMatch(/^HTTP\/1\.[01] 200 OK\n$/)
    expect((await t.api.send(id, `raw ${HOST_SIDE}:8080`)).text).toBe('HTTP/1.1 403 Forbidden\n')
    expect((await t.api.send(id, `raw 127.0.0.1:${hostLoopbackPort}`)).text).toMatch(/^ERR/)
    expect((await t.api.send(id, 'raw 169.254.169.254:80')).text).toBe('HTTP/1.1 403 Forbidden\n')
    expect((await t.api.send(id, 'tls 192.0.2.7:443')).text).toMatch(/^ERR/)
    expect((await t.api.send(id, `tls ${TEST_HOST}:8081`)).text).toMatch(/^ERR/)
    expect((await t.api.send(id, `tls ${HOST_SIDE}:443`)).text).toMatch(/^ERR/)
    const log = await t.api.call('GET', `/v1/sessions/${id}/network`)
    const decisions = log.body.data.map(
      (e: { host: string; port: number; allowed: boolean }) => `${e.host}:${e.port}:${e.allowed}`,
    )
    expect(decisions).toContain(`${TEST_NAME}:8080:true`)
    expect(decisions).toContain(`${HOST_SIDE}:8080:false`)
    expect(decisions).toContain('169.254.169.254:80:false')
    expect(decisions).toContain('192.0.2.7:443:false')
    expect(decisions).toContain(`${TEST_HOST}:8081:false`)
    expect(decisions).toContain(`${HOST_SIDE}:443:false`)
  })

  it('serves a keep-alive client several calls in a row through the transparent egress', async () => {
    const { id } = await t.api.createSession('closed', {
      network: { allow: [`${TEST_NAME}:${KEEP_ALIVE_PORT}`] },
    })
    // Node's http ignores the proxy variables: the calls go out through the redirect and the
    // forwarder, which sends each connection's request as one proxy request.
    const script = [
      'const http = require("http");',
      'const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });',
      `const get = (n) => new Promise((done) => http.get({ host: "${TEST_NAME}", port: ${KEEP_ALIVE_PORT}, path: "/k" + n, agent }, (r) => {`,
      '  let body = ""; r.on("data", (d) => (body += d)); r.on("end", () => done(r.statusCode + " " + body.trim()))',
      '}).on("error", (e) => done("ERR " + e.code)));',
      ';(async () => { const out = []; for (let n = 1; n <= 4; n++) out.push(await get(n)); console.log(out.join(", ")) })()',
    ].join('\n')
    // One line (the probe reads lines), in single quotes (the script has none).
    expect((await t.api.send(id, `run node -e '${script.replaceAll('\n', ' ')}'`)).text.trim()).toBe(
      '200 ok /k1, 200 ok /k2, 200 ok /k3, 200 ok /k4 [exit 0]',
    )
  })

  it("keeps the forwarder's ports out of the session's open ports and previews", async () => {
    const { id } = await t.api.createSession('allowed')
    expect((await t.api.send(id, `raw ${TEST_NAME}:8080`)).text).toMatch(/^HTTP\/1\.[01] 200 OK\n$/)
    const manifest = await t.api.call('GET', `/v1/sessions/${id}/manifest`)
    expect(manifest.status).toBe(200)
    expect(manifest.body.openPorts).toEqual([])
    // A preview of the forwarder would lend its caller the session's egress and proxy secrets.
    for (const port of [3128, 3129, 3153]) {
      const res = await previewFetch(`${previewOrigin(t.server.previewPort, id, port)}/`, {
        headers: { authorization: `Bearer ${t.key}` },
      })
      const body = (await res.json()) as { error: { code: string } }
      expect(res.status, JSON.stringify(body)).toBe(403)
      expect(body.error.code).toBe('forbidden')
    }
  })
})
