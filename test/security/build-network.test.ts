import type { ChildProcess } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { DRIVERS, probeDrivers } from '../conformance/harness.js'
import { createNetnsHost, type NetnsHost, netnsAddresses, serveDirectory } from '../helpers/netns.js'
import { makeProject } from '../helpers/projects.js'
import { packDir, startTestServer, type TestServer } from '../helpers/server.js'

// A revision build (the dependency install and `setup:`) runs the project's code with network
// access. It must leave only through the egress proxy, allowed the agent's `network.allow` plus
// the operator's registries: never the host's loopback, a host-only address or the host's
// abstract unix sockets.

const SUBNET = 238
const { hostSide: HOST_SIDE, address: TEST_HOST } = netnsAddresses(SUBNET)
// A name only this server's egress proxy knows (an operator's internal registry, say).
const REGISTRY_NAME = `registry-${process.pid}.cairn.test`
const ABSTRACT_NAME = `cairn-build-test-${process.pid}`
const drivers = await probeDrivers()
let netnsHost: NetnsHost | undefined
let web: ChildProcess | undefined
let webRoot = ''
let t: TestServer
const listeners: net.Server[] = []
let loopbackPort = 0
let hostOnlyPort = 0

/** A listener on the host that answers every connection with `reply` and closes it. */
async function listen(address: string | { path: string }, reply: string): Promise<net.Server> {
  const server = net.createServer((socket) => socket.end(`${reply}\n`))
  await new Promise<void>((resolve) =>
    typeof address === 'string' ? server.listen(0, address, resolve) : server.listen(address.path, resolve),
  )
  listeners.push(server)
  return server
}

const portOf = (server: net.Server) => (server.address() as net.AddressInfo).port

/** Python that tries each way out and prints one `name: result` line per attempt. */
function probe(apiPort: number): string {
  return [
    'import socket, urllib.request',
    'def raw(host, port):',
    '    try:',
    '        s = socket.create_connection((host, port), timeout=3)',
    '        s.sendall(b"GET /v1/health HTTP/1.0\\r\\n\\r\\n")',
    '        reply = s.recv(4096).decode(errors="replace")',
    '        return reply.splitlines()[0] if reply else "ERR closed"',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    'def abstract(name):',
    '    try:',
    '        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)',
    '        s.settimeout(3)',
    '        s.connect("\\0" + name)',
    '        return s.recv(4096).decode(errors="replace").strip() or "ERR closed"',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    'def get(url):',
    '    try:',
    '        return urllib.request.urlopen(url, timeout=5).read().decode().strip()',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__ + " " + str(e)[:60]',
    `print("probe loopback:", raw("127.0.0.1", ${loopbackPort}))`,
    `print("probe api:", raw("127.0.0.1", ${apiPort}))`,
    `print("probe host-only:", raw("${HOST_SIDE}", ${hostOnlyPort}))`,
    `print("probe abstract:", abstract("${ABSTRACT_NAME}"))`,
    `print("probe agent-allowed:", get("http://${TEST_HOST}:8080/hello.txt"))`,
    `print("probe operator-allowed:", get("http://${REGISTRY_NAME}:8080/hello.txt"))`,
    `print("probe not-allowed:", get("http://${HOST_SIDE}:${hostOnlyPort}/"))`,
    '',
  ].join('\n')
}

beforeAll(async () => {
  netnsHost = createNetnsHost('bnet', SUBNET)
  webRoot = await mkdtemp(path.join(os.tmpdir(), 'cairn-build-web-'))
  await writeFile(path.join(webRoot, 'hello.txt'), 'hello from the test host\n')
  web = await serveDirectory(netnsHost, webRoot, 'hello.txt')
  loopbackPort = portOf(await listen('127.0.0.1', 'host loopback secret'))
  hostOnlyPort = portOf(await listen(HOST_SIDE, 'host-only secret'))
  await listen({ path: `\0${ABSTRACT_NAME}` }, 'abstract socket secret')
  t = await startTestServer({
    server: {
      egressPrivateExceptions: [TEST_HOST],
      egressHosts: { [REGISTRY_NAME]: TEST_HOST },
      buildEgressAllow: [`${REGISTRY_NAME}:8080`],
    },
  })
})

afterAll(async () => {
  await t?.close()
  for (const server of listeners) server.close()
  web?.kill('SIGKILL')
  netnsHost?.remove()
  if (webRoot) await rm(webRoot, { recursive: true, force: true })
})

/** Deploys, waits for the build, and answers the probe's lines from its log (and the log). */
async function buildProbes(
  files: Record<string, string>,
): Promise<{ results: Record<string, string>; log: string }> {
  const res = await t.api.call('POST', '/v1/agents?wait=true', await packDir(await makeProject(files)))
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  const { id, agentId } = res.body.revision
  const log = await t.api.call('GET', `/v1/agents/${agentId}/revisions/${id}/logs`)
  const lines = log.body.lines as string[]
  expect(res.body.revision.status, lines.join('\n')).toBe('READY')
  const results: Record<string, string> = {}
  for (const line of lines) {
    const match = /^probe ([a-z-]+): (.*)$/.exec(line)
    if (match?.[1] && match[2] !== undefined) results[match[1]] = match[2]
  }
  return { results, log: lines.join('\n') }
}

function expectContained({ results, log }: { results: Record<string, string>; log: string }): void {
  expect(Object.keys(results)).toHaveLength(7)
  // Nothing of the host: its loopback, the server's own API, a host-only address, its abstract sockets.
  expect(results.loopback).toMatch(/^ERR/)
  expect(results.api).toMatch(/^ERR/)
  expect(results['host-only']).toMatch(/^(ERR|HTTP\/1\.1 403 Forbidden$)/)
  expect(results.abstract).toMatch(/^ERR/)
  expect(results['not-allowed']).toMatch(/^ERR HTTPError HTTP Error 403/)
  // What the agent's allowlist and the operator's registry list name goes through the proxy.
  expect(results['agent-allowed']).toBe('hello from the test host')
  expect(results['operator-allowed']).toBe('hello from the test host')
  // Refusals are in the build log.
  expect(log).toContain(`egress: refused ${HOST_SIDE}:${hostOnlyPort}`)
}

describe.each(DRIVERS)('%s driver: a revision build leaves only through the egress proxy', (isolation) => {
  const test = it.skipIf(!drivers[isolation].ok)
  const header = (name: string) =>
    `name: ${name}-${isolation}\ncommand: bash -c 'while read -r l; do echo ok; done'\nisolation: ${isolation}\nnetwork:\n  allow: ["${TEST_HOST}:8080"]\n`

  test('setup: reaches the allowed hosts, and nothing of the host', async () => {
    const apiPort = Number(new URL(t.url).port)
    expectContained(
      await buildProbes({
        'cairn.yaml': `${header('setup-probe')}setup: python3 probe.py\n`,
        'probe.py': probe(apiPort),
      }),
    )
  })

  test("the dependency install (the project's preinstall script) reaches the allowed hosts, and nothing of the host", async () => {
    const apiPort = Number(new URL(t.url).port)
    const hex = Buffer.from(probe(apiPort)).toString('hex')
    expectContained(
      await buildProbes({
        'cairn.yaml': header('install-probe'),
        'package.json': JSON.stringify({
          name: `install-probe-${isolation}`,
          version: '1.0.0',
          scripts: { preinstall: `python3 -c "exec(bytes.fromhex('${hex}').decode())"` },
        }),
      }),
    )
  })
})
