import { mkdtemp, readFile, rm } from 'node:fs/promises'
import http2 from 'node:http2'
import net from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import {
  type ClusterTls,
  initClusterTls,
  LocalRuntimePort,
  loadClusterTls,
  RemoteRuntimePort,
  type ServedRuntimePort,
  serveRuntimePort,
} from '@cairn/runtime/port'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeCaCertificate, signCertificate } from '../../packages/runtime/src/tls/openssl-certificates.js'
import { openTestRuntime, type TestRuntime } from '../../packages/runtime/test/harness.js'

// A runtime node serves its port (start sandboxes, read and write every workspace) on the
// network. Only the cluster's API replicas may call it: a client must show a certificate of the
// cluster CA named cairn-api. And an API replica talks only to a node showing the CA's cairn-node
// certificate, so a machine on the path cannot pose as a node and collect prompts and files.

let t: TestRuntime
let port: LocalRuntimePort
let node: ServedRuntimePort
let dir: string
let cluster: { api: ClusterTls; node: ClusterTls }
let other: { api: ClusterTls; node: ClusterTls }
/** Signed by the cluster's CA, fit for both ends of TLS, but for a name that is neither role's. */
let stranger: ClusterTls

/** What a raw HTTP/2 client with `tls` gets for a call: the node's answer, or the refusal it met. */
async function rawCall(tls: Partial<ClusterTls>): Promise<string> {
  return new Promise((resolve) => {
    const session = http2.connect(node.url, {
      ca: cluster.api.ca,
      ...(tls.cert ? { cert: tls.cert, key: tls.key } : {}),
      checkServerIdentity: () => undefined,
    })
    session.on('error', (error) => resolve(`refused: ${error.message}`))
    const stream = session.request({ ':method': 'POST', ':path': '/cairn.port/warmCount' })
    stream.on('error', (error) => resolve(`refused: ${error.message}`))
    let body = ''
    stream.on('data', (d: Buffer) => {
      body += d.toString()
    })
    stream.on('end', () => {
      session.close()
      resolve(body ? `answered: ${body.trim()}` : 'refused: no answer')
    })
    stream.end('[]\n')
  })
}

beforeAll(async () => {
  t = await openTestRuntime()
  port = new LocalRuntimePort(t.runtime, { clock: { now: () => Date.now() } })
  dir = await mkdtemp(path.join(tmpdir(), 'cairn-cluster-mtls-'))
  for (const name of ['ours', 'theirs']) await initClusterTls(path.join(dir, name))
  cluster = {
    api: await loadClusterTls(path.join(dir, 'ours'), 'api'),
    node: await loadClusterTls(path.join(dir, 'ours'), 'node'),
  }
  other = {
    api: await loadClusterTls(path.join(dir, 'theirs'), 'api'),
    node: await loadClusterTls(path.join(dir, 'theirs'), 'node'),
  }
  const signed = await signCertificate({
    caCertFile: path.join(dir, 'ours', 'ca.pem'),
    caKeyFile: path.join(dir, 'ours', 'ca-key.pem'),
    subject: '/O=Cairn/CN=cairn-stranger',
    days: 1,
    extensions: ['extendedKeyUsage=clientAuth,serverAuth'],
    workIn: dir,
  })
  stranger = { ca: cluster.api.ca, cert: signed.certPem, key: signed.keyPem }
  node = await serveRuntimePort(port, { host: '127.0.0.1', port: 0, tls: cluster.node })
})

afterAll(async () => {
  await node?.close()
  await t?.close()
  if (dir) await rm(dir, { recursive: true, force: true })
})

describe("a runtime node's port on the network", () => {
  it("answers the cluster's API certificate", async () => {
    expect(await rawCall(cluster.api)).toMatch(/^answered: \{"result":\d+\}$/)
  })

  it('refuses a client without a certificate, with a self-signed cairn-api one, or one of another CA', async () => {
    expect(await rawCall({})).toMatch(/^refused/)
    const selfSigned = path.join(dir, 'self')
    await makeCaCertificate({
      keyFile: `${selfSigned}-key.pem`,
      certFile: `${selfSigned}.pem`,
      subject: '/O=Cairn/CN=cairn-api',
      days: 1,
    })
    const forged = {
      cert: await readFile(`${selfSigned}.pem`, 'utf8'),
      key: await readFile(`${selfSigned}-key.pem`, 'utf8'),
    }
    expect(await rawCall(forged)).toMatch(/^refused/)
    expect(await rawCall(other.api)).toMatch(/^refused/)
  })

  it("refuses the CA's certificates that are not an API replica's: a node's, or one for another name", async () => {
    expect(await rawCall(cluster.node)).toMatch(/^refused/)
    expect(await rawCall(stranger)).toMatch(/^refused/)
  })

  it('closes a connection that never finishes its handshake, so strangers cannot hold its sockets', async () => {
    // Anyone on the network can open a connection; only the handshake tells who it is. A peer that
    // opens many and never speaks must not hold them (node:tls waits 120 s by default).
    const { hostname, port: tcpPort } = new URL(node.url)
    const socket = net.connect(Number(tcpPort), hostname)
    socket.on('error', () => undefined)
    const openedMs = Date.now()
    await new Promise((resolve) => socket.once('close', resolve))
    expect(Date.now() - openedMs).toBeLessThan(30_000)
  }, 40_000)

  it('an API replica refuses a server that is not a node of its cluster, however willing it is', async () => {
    // Impostors that accept any client and answer every call: one with another CA's node
    // certificate, one with the cluster's own API certificate, one with a certificate of the
    // cluster's CA for another name (the right CA, not a node's name).
    for (const impostorTls of [other.node, cluster.api, stranger]) {
      let calls = 0
      const impostor = http2.createSecureServer({ cert: impostorTls.cert, key: impostorTls.key })
      impostor.on('stream', (stream) => {
        calls++
        stream.respond({ ':status': 200, 'cairn-kind': 'frames' })
        stream.end('{"result":0}\n')
      })
      await new Promise<void>((resolve) => impostor.listen(0, '127.0.0.1', resolve))
      const { port: impostorPort } = impostor.address() as { port: number }
      const client = new RemoteRuntimePort({ url: `https://127.0.0.1:${impostorPort}`, tls: cluster.api })
      try {
        const error = await client.warmCount().then(
          () => undefined,
          (e: unknown) => e,
        )
        expect(error).toBeInstanceOf(CairnProblem)
        expect((error as CairnProblem).code).toBe('node_unavailable')
        expect(calls).toBe(0)
      } finally {
        await client.close()
        await new Promise<void>((resolve) => impostor.close(() => resolve()))
      }
    }
  })
})
