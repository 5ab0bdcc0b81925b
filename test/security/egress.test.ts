import { type ChildProcess, execFileSync } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createNetnsHost, type NetnsHost, netnsAddresses } from '../helpers/netns.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// A test host in its own network namespace, reachable from the host over a veth pair.
const SUBNET = 231
const { hostSide: HOST_SIDE, address: TEST_HOST } = netnsAddresses(SUBNET)
let netnsHost: NetnsHost | undefined
let web: ChildProcess | undefined
let webRoot = ''
let t: TestServer
let hostLoopback: http.Server
let hostLoopbackPort = 0

beforeAll(async () => {
  netnsHost = createNetnsHost('egress', SUBNET)
  webRoot = await mkdtemp(path.join(os.tmpdir(), 'cairn-egress-web-'))
  await writeFile(path.join(webRoot, 'hello.txt'), 'hello from the test host\n')
  web = netnsHost.spawn(
    ['python3', '-m', 'http.server', '8080', '--bind', TEST_HOST, '--directory', webRoot],
    {
      stdio: 'ignore',
    },
  )
  for (let i = 0; i < 50; i++) {
    try {
      execFileSync('python3', [
        '-c',
        `import urllib.request; urllib.request.urlopen("http://${TEST_HOST}:8080/hello.txt", timeout=1)`,
      ])
      break
    } catch {
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  hostLoopback = http.createServer((_req, res) => res.end('host loopback secret\n'))
  await new Promise<void>((resolve) => hostLoopback.listen(0, '127.0.0.1', resolve))
  hostLoopbackPort = (hostLoopback.address() as AddressInfo).port

  t = await startTestServer({ server: { egressPrivateExceptions: [TEST_HOST] } })
  const probe = [
    'import socket, sys, urllib.request',
    'def get(url):',
    '    try:',
    '        return urllib.request.urlopen(url, timeout=3).read().decode().strip()',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__ + " " + str(e)[:80]',
    'def raw(host, port):',
    '    try:',
    '        socket.create_connection((host, port), timeout=2).close()',
    '        return "CONNECTED"',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    'def dns(name):',
    '    try:',
    '        return socket.getaddrinfo(name, 443)[0][4][0]',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    'while True:',
    '    line = input()',
    '    kind, _, arg = line.partition(" ")',
    '    if kind == "get": print(get(arg))',
    '    elif kind == "raw": h, p = arg.split(":"); print(raw(h, int(p)))',
    '    elif kind == "dns": print(dns(arg))',
  ].join('\n')
  for (const [name, network] of [
    ['allowed', `network:\n  allow: ["${TEST_HOST}:8080"]\n`],
    ['closed', ''],
  ] as const) {
    const project = await makeProject({
      'cairn.yaml': `name: ${name}\ncommand: python3 probe.py\n${network}`,
      'probe.py': probe,
    })
    expect((await t.api.deploy(project)).status).toBe(201)
  }
})

afterAll(async () => {
  await t?.close()
  hostLoopback?.close()
  web?.kill('SIGKILL')
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
    // Without the proxy: no route out at all.
    expect((await t.api.send(id, `raw ${TEST_HOST}:8080`)).text).toMatch(/^ERR/)
    expect((await t.api.send(id, `raw ${HOST_SIDE}:22`)).text).toMatch(/^ERR/)
    expect((await t.api.send(id, 'dns example.com')).text).toMatch(/^ERR/)
    const log = await t.api.call('GET', `/v1/sessions/${id}/network`)
    const decisions = log.body.data.map((e: { host: string; allowed: boolean }) => `${e.host}:${e.allowed}`)
    expect(decisions).toContain(`${TEST_HOST}:true`)
    expect(decisions).toContain(`${HOST_SIDE}:false`)
    expect(decisions).toContain('169.254.169.254:false')
    expect(decisions).toContain('example.com:false')
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
})
