import { execFile } from 'node:child_process'
import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import net from 'node:net'
import path from 'node:path'
import { promisify } from 'node:util'
import { CgroupManager, readMounts } from '@cairn/runtime'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { CAIRN_CLI, type ClusterNode, TestCluster } from '../helpers/cluster.js'
import { replyDevice, WHERE_AGENT } from '../helpers/cluster-cairn.js'
import { routeTo } from '../helpers/cluster-network.js'
import { waitFor } from '../helpers/cluster-process.js'
import { postgresBinDir, testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { Api } from '../helpers/server.js'

const run = promisify(execFile)

// The cluster test bed itself, with plain processes: the namespaces, their links and the
// blackhole behind them, the partition, the faults on a process, and a cleanup that leaves nothing.
let cluster: TestCluster

beforeAll(async () => {
  if (testsRunOnPostgres()) cluster = await TestCluster.start({ nodes: 2 })
}, 120_000)

afterAll(async () => {
  await cluster?.close()
})

/** Connects from inside `node`'s namespace: 'connected', 'refused', 'timeout' or another error code. */
async function probeFrom(node: ClusterNode, host: string, port: number, timeoutMs = 1000): Promise<string> {
  const script = `const s=require('net').connect(${port},'${host}');s.setTimeout(${timeoutMs},()=>{console.log('timeout');process.exit(0)});s.on('connect',()=>{console.log('connected');process.exit(0)});s.on('error',(e)=>{console.log(e.code==='ECONNREFUSED'?'refused':e.code);process.exit(0)})`
  const [command, ...args] = node.network.wrap([process.execPath, '-e', script]) as [string, ...string[]]
  return (await run(command, args)).stdout.trim()
}

/** Connects from the root namespace (same answers as `probeFrom`). */
async function probe(host: string, port: number, timeoutMs = 1000): Promise<string> {
  return await new Promise((resolve) => {
    const socket = net.connect(port, host)
    socket.setTimeout(timeoutMs, () => {
      socket.destroy()
      resolve('timeout')
    })
    socket.on('connect', () => {
      socket.destroy()
      resolve('connected')
    })
    socket.on('error', (e: NodeJS.ErrnoException) =>
      resolve(e.code === 'ECONNREFUSED' ? 'refused' : `${e.code}`),
    )
  })
}

describe.skipIf(!testsRunOnPostgres())('the cluster test bed', () => {
  it('puts each node in its own namespace, reaching PostgreSQL only over its link', async () => {
    const [n1, n2] = cluster.nodes as [ClusterNode, ClusterNode]
    expect(n1.network.ns).toBe(`cairnc-${process.pid}-n1`)
    expect(n1.network.address).not.toBe(n2.network.address)
    const pg = cluster.postgres.port
    expect(await probeFrom(n1, n1.network.hostSide, pg)).toBe('connected')
    expect(await probeFrom(n2, n2.network.hostSide, pg)).toBe('connected')
    // Its own loopback is not the host's; and no route leads anywhere but its link.
    expect(await probeFrom(n1, '127.0.0.1', pg)).toBe('refused')
    expect(await probeFrom(n1, '192.0.2.1', 80)).toBe('ENETUNREACH')
    // Real SQL through the node's URL (psql inside the namespace).
    const [psql, ...args] = n1.network.wrap([
      path.join(postgresBinDir(), 'psql'),
      n1.databaseUrl('postgres'),
      '-XAtc',
      'SELECT 41 + 1',
    ]) as [string, ...string[]]
    expect((await run(psql, args)).stdout.trim()).toBe('42')
  })

  it('sends a cut link into the blackhole route, never out of the default route', async () => {
    const n2 = cluster.nodes[1] as ClusterNode
    expect(routeTo(n2.network.address)).toContain(`dev ${n2.network.veth}`)
    n2.network.cutLink()
    try {
      // The /30 route is gone with the link; the range's blackhole answers at once.
      expect(routeTo(n2.network.address)).toMatch(/^error: .*Invalid argument/)
      expect(await probe(n2.network.address, 9)).toBe('EINVAL')
    } finally {
      n2.network.restoreLink()
    }
    await waitFor('the link back', () => routeTo(n2.network.address).includes(`dev ${n2.network.veth}`))
  })

  it('partitions one node from PostgreSQL (packets dropped both ways), then heals it', async () => {
    const [n1, n2] = cluster.nodes as [ClusterNode, ClusterNode]
    const pg = cluster.postgres.port
    // Another port on the same address stays reachable: the partition is PostgreSQL's alone.
    const other = net.createServer((s) => s.end())
    await new Promise<void>((r) => other.listen(0, n1.network.hostSide, r))
    const otherPort = (other.address() as net.AddressInfo).port
    try {
      n1.partitionFromPostgres()
      expect(n1.network.partitioned()).toBe(true)
      expect(await probeFrom(n1, n1.network.hostSide, pg)).toBe('timeout')
      expect(await probeFrom(n1, n1.network.hostSide, otherPort)).toBe('connected')
      expect(await probeFrom(n2, n2.network.hostSide, pg)).toBe('connected')
      n1.healPartition()
      expect(n1.network.partitioned()).toBe(false)
      expect(await probeFrom(n1, n1.network.hostSide, pg)).toBe('connected')
    } finally {
      n1.healPartition()
      other.close()
    }
  })

  it('runs a runtime in a node (its pool, run dir, cgroups); SIGSTOP, SIGCONT and kill -9 act on it', async () => {
    const n1 = cluster.nodes[0] as ClusterNode
    // A single-process server stands in for `cairn node`: it owns a runtime the same way.
    const server = await n1.spawn([
      process.execPath,
      CAIRN_CLI,
      'server',
      '--data-dir',
      n1.dataDir,
      '--pool-path',
      n1.poolPath,
      '--host',
      n1.network.address,
      '--port',
      '0',
      '--json',
    ])
    const { url, adminKeyPath } = JSON.parse(await server.waitForLine(/"url"/)) as {
      url: string
      adminKeyPath: string
    }
    expect(new URL(url).hostname).toBe(n1.network.address)
    const api = new Api(url, (await readFile(adminKeyPath, 'utf8')).trim())
    const project = await makeProject(WHERE_AGENT)
    expect((await api.deploy(project)).status).toBe(201)
    const session = await api.createSession('where', { keepWarmMs: 600_000 })
    const turn = await api.send(session.id, 'hello')
    expect(turn.terminal?.type).toBe('run.completed')
    // The reply names the device of the workspace: this node's pool.
    expect(turn.text).toBe(`hello @${await n1.poolDevice()}\n`)
    expect(replyDevice(turn.text)).toMatch(/^\/dev\/loop\d+$/)
    // Its sandbox lives in the node's own cgroup scope; its pool is the node's btrfs.
    const scope = new CgroupManager(`cairn/${path.basename(n1.runDir)}`)
    expect((await scope.list()).length).toBeGreaterThan(0)
    expect(readMounts().some((m) => m.mountPoint.startsWith(`${n1.runDir}/`))).toBe(true)

    server.signal('SIGSTOP')
    expect(await probe(n1.network.address, Number(new URL(url).port), 300)).toBe('connected') // the kernel accepts
    const stalled = await Promise.race([
      fetch(`${url}/healthz`).then(() => 'answered'),
      new Promise((r) => setTimeout(() => r('stalled'), 500)),
    ])
    expect(stalled).toBe('stalled')
    server.signal('SIGCONT')
    expect((await fetch(`${url}/healthz`)).status).toBe(200)

    await n1.kill9()
    expect(await server.exited).toEqual({ code: null, signal: 'SIGKILL' })
    expect(await probe(n1.network.address, Number(new URL(url).port))).toBe('refused')
  })

  it('removes everything it made, even what a killed process left', async () => {
    const n1 = cluster.nodes[0] as ClusterNode
    const { prefix, dir, cgroupDir } = cluster
    const images = cluster.nodes.map((n) => n.poolImage)
    const runDirs = cluster.nodes.map((n) => n.runDir)
    const range = n1.network.address.replace(/\.\d+$/, '.0/24')
    expect((await run('ip', ['route', 'show', range])).stdout).toContain('blackhole')
    await cluster.close()
    expect((await run('ip', ['netns', 'list'])).stdout).not.toContain(prefix)
    expect((await run('ip', ['route', 'show', range])).stdout.trim()).toBe('')
    const mounts = readMounts().map((m) => m.mountPoint)
    expect(mounts.filter((m) => m.startsWith(dir) || runDirs.some((r) => m.startsWith(r)))).toEqual([])
    const loops = (await run('losetup', ['--list', '--noheadings', '--output', 'BACK-FILE'])).stdout
    for (const image of images) expect(loops).not.toContain(image)
    expect(existsSync(cgroupDir)).toBe(false)
    expect(existsSync(dir)).toBe(false)
    for (const runDir of runDirs) {
      expect(existsSync(runDir)).toBe(false)
      expect(await new CgroupManager(`cairn/${path.basename(runDir)}`).list()).toEqual([])
    }
  })
})
