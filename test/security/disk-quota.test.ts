import { execFile } from 'node:child_process'
import { statSync } from 'node:fs'
import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { BtrfsPool } from '../../packages/runtime/src/storage/btrfs-pool.js'
import { DRIVERS, probeDrivers } from '../conformance/harness.js'
import { undocumentedAnswer } from '../helpers/openapi-conformance.js'
import { closeOwned } from '../helpers/pool-owners.js'
import { makeProject } from '../helpers/projects.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'

/**
 * One session filling the pool for everyone (issue 15, item 6): a workspace is capped, a tenant's
 * workspaces and snapshots together are capped, agents together never take the pool's reserve, a
 * full quota is a typed error for that session only, and deleting files and snapshots gives the
 * space back.
 */
const run = promisify(execFile)
const MiB = 1024 * 1024
const WORKSPACE_MIB = 48
const TENANT_MIB = 80

/**
 * `fill` writes incompressible MiBs to fill.bin until a write fails, and lets the error kill it
 * (the turn fails the way a careless agent's would); `write NAME MIB` writes one file and answers.
 */
const FILLER = {
  'cairn.yaml': 'name: filler\ncommand: python3 -u filler.py\n',
  'filler.py': [
    'import os',
    'while True:',
    '    words = input().split()',
    '    if words[0] == "fill":',
    '        with open("fill.bin", "wb") as f:',
    '            while True:',
    '                f.write(os.urandom(1 << 20))',
    '    if words[0] == "write":',
    '        with open(words[1], "wb") as f:',
    '            for _ in range(int(words[2])):',
    '                f.write(os.urandom(1 << 20))',
    '        print("wrote", words[1])',
  ].join('\n'),
}

function failure(run: { terminal?: unknown }): { code: string; message: string } | undefined {
  const terminal = run.terminal as { type: string; error?: { code: string; message: string } } | undefined
  return terminal?.type === 'run.failed' ? terminal.error : undefined
}

function put(api: Api, session: string, name: string, bytes: number) {
  return api.call(
    'PUT',
    `/v1/sessions/${session}/files/content?path=${name}`,
    Buffer.alloc(bytes, 7).map((_, i) => (i * 2654435761) >>> 24),
    { 'content-type': 'application/octet-stream' },
  )
}

async function deleteAllSnapshots(api: Api, session: string): Promise<number> {
  const list = await api.call('GET', `/v1/sessions/${session}/snapshots`)
  for (const snap of list.body.data as { id: string }[]) {
    const res = await api.call('DELETE', `/v1/sessions/${session}/snapshots/${snap.id}`)
    expect(res.status).toBe(200)
  }
  return list.body.data.length
}

describe('btrfs: quotas per workspace and per tenant', () => {
  let t: TestServer
  let tenantB: Api

  beforeAll(async () => {
    t = await startTestServer({
      server: { workspaceQuotaMiB: WORKSPACE_MIB, tenantQuotaMiB: TENANT_MIB, rateLimitPerSecond: 0 },
    })
    const project = await makeProject(FILLER)
    expect((await t.api.deploy(project)).status).toBe(201)
    const key = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b', role: 'admin' })
    expect(key.status).toBe(201)
    tenantB = new Api(t.url, key.body.key)
    expect((await tenantB.deploy(project)).status).toBe(201)
  })

  afterAll(async () => {
    await closeOwned(t)
  })

  it('reports the limits in force in GET /v1/runtime', async () => {
    const runtime = await t.api.call('GET', '/v1/runtime')
    expect(runtime.body.storage).toMatchObject({
      driver: 'btrfs',
      quotas: { enforced: true, workspaceBytes: WORKSPACE_MIB * MiB, tenantBytes: TENANT_MIB * MiB },
      warnings: [],
    })
    const { reserveBytes, agentsTotalBytes } = runtime.body.storage.quotas
    expect(reserveBytes).toBeGreaterThanOrEqual(16 * MiB)
    expect(agentsTotalBytes).toBeLessThanOrEqual(
      (await t.server.runtime.pool.poolStats()).totalBytes - reserveBytes,
    )
  })

  it("a session that fills its workspace gets quota_exceeded, alone; the tenant's snapshots count until deleted", async () => {
    const a = (await t.api.createSession('filler')).id
    const b = (await tenantB.createSession('filler')).id

    // A fills until the kernel refuses: its turn fails with the typed code, not a storage_error.
    const filled = await t.api.send(a, 'fill')
    expect(failure(filled)?.code).toBe('quota_exceeded')
    expect(failure(filled)?.message).toContain('quota')
    expect((await t.api.call('GET', `/v1/sessions/${a}`)).body).toMatchObject({
      status: 'failed',
      statusCause: 'quota_exceeded',
    })
    const fillBytes = statSync(path.join(t.server.runtime.pool.workspacePath(a), 'fill.bin')).size
    expect(fillBytes).toBeGreaterThan((WORKSPACE_MIB - 8) * MiB)
    expect(fillBytes).toBeLessThanOrEqual(WORKSPACE_MIB * MiB)

    // Tenant A sees what it holds against its quota.
    const usage = await t.api.call('GET', '/v1/usage')
    expect(usage.body.quota).toMatchObject({ enforced: true, tenantBytes: TENANT_MIB * MiB })
    expect(usage.body.quota.usedBytes).toBeGreaterThan((WORKSPACE_MIB - 8) * MiB)

    // The files API answers A with the typed code too (507), never a 500.
    const refused = await put(t.api, a, 'more.bin', 4 * MiB)
    expect(refused.status).toBe(507)
    expect(refused.body.error.code).toBe('quota_exceeded')

    // Tenant B is not touched: files and turns work.
    const fine = await put(tenantB, b, 'upload.bin', 4 * MiB)
    expect(fine.status).toBe(200)
    const turn = await tenantB.send(b, 'write blob.bin 8')
    expect(turn.terminal?.type).toBe('run.completed')
    expect(turn.text).toBe('wrote blob.bin\n')

    // A snapshot of the full workspace is still taken (Cairn's own write), then the file goes.
    // With simple quotas a workspace counts what it wrote and still holds, its snapshots' share
    // included: the snapshot keeps fill.bin's data, so A stays full until the snapshot goes.
    const snap = await t.api.call('POST', `/v1/sessions/${a}/snapshots`, {})
    expect(snap.status).toBe(201)
    const del = await t.api.call('DELETE', `/v1/sessions/${a}/files?path=fill.bin`)
    expect(del.status, JSON.stringify(del.body)).toBe(200)
    const stillFull = await put(t.api, a, 'again.bin', 8 * MiB)
    expect(stillFull.status).toBe(507)
    expect(stillFull.body.error.code).toBe('quota_exceeded')
    // The tenant's total: a second session of A meets it before its own workspace limit.
    const a2 = (await t.api.createSession('filler')).id
    const filled2 = await t.api.send(a2, 'fill')
    expect(failure(filled2)?.code).toBe('quota_exceeded')
    const fill2Bytes = statSync(path.join(t.server.runtime.pool.workspacePath(a2), 'fill.bin')).size
    expect(fill2Bytes).toBeLessThanOrEqual((TENANT_MIB - WORKSPACE_MIB + 8) * MiB)
    // Tenant A is full, so even a new session is refused; tenant B still starts one.
    const a3 = await t.api.call('POST', '/v1/sessions', { agent: 'filler' })
    expect(a3.status).toBe(507)
    expect(a3.body.error.code).toBe('quota_exceeded')
    expect((await tenantB.createSession('filler')).id).toMatch(/^ses_/)
    // So is a restore (a new writable copy), and it leaves no half-made copy behind.
    const restore = await t.api.call('POST', `/v1/sessions/${a}/restore`, { snapshotId: snap.body.id })
    expect(restore.status).toBe(507)
    expect(restore.body.error.code).toBe('quota_exceeded')
    const sessionsArea = await t.server.runtime.pool.listArea('sessions')
    expect(sessionsArea.filter((name) => name.startsWith(a))).toEqual([a])

    // Deleting A's snapshots gives the space back at once: btrfs frees a deleted subvolume's
    // extents only after a transaction commit (every 30 s unless one is asked for), and the pool
    // asks for one after each deletion, so A's next write fits within a few seconds, not 30.
    expect(await deleteAllSnapshots(t.api, a)).toBeGreaterThan(0)
    let status = 0
    const freeingStarted = Date.now()
    for (let i = 0; i < 20 && status !== 200; i++) {
      status = (await put(t.api, a, 'again.bin', 8 * MiB)).status
      if (status !== 200) await new Promise((r) => setTimeout(r, 500))
    }
    console.log(`[disk-quota] the space came back ${Date.now() - freeingStarted} ms after the deletions`)
    expect(status).toBe(200)
    expect((await t.api.call('POST', `/v1/sessions/${a}/resume`)).status).toBe(200)
    const after = await t.api.send(a, 'write small.bin 1')
    expect(after.terminal?.type).toBe('run.completed')
  })

  it('refuses to delete a snapshot an export is reading (snapshot_in_use), then deletes it', async () => {
    const session = (await t.api.createSession('filler')).id
    expect((await t.api.send(session, 'write big.bin 24')).text).toBe('wrote big.bin\n')
    const snapshotId = (await t.api.call('POST', `/v1/sessions/${session}/snapshots`, {})).body.id
    const controller = new AbortController()
    const reading = await fetch(`${t.url}/v1/sessions/${session}/export?snapshot=${snapshotId}`, {
      headers: { authorization: `Bearer ${t.key}` },
      signal: controller.signal,
    })
    expect(reading.status).toBe(200)
    const busy = await t.api.call('DELETE', `/v1/sessions/${session}/snapshots/${snapshotId}`)
    expect(busy.status).toBe(409)
    expect(busy.body.error.code).toBe('snapshot_in_use')
    controller.abort()
    await reading.body?.cancel().catch(() => undefined)
    let status = 0
    for (let i = 0; i < 40 && status !== 200; i++) {
      status = (await t.api.call('DELETE', `/v1/sessions/${session}/snapshots/${snapshotId}`)).status
      if (status !== 200) await new Promise((r) => setTimeout(r, 100))
    }
    expect(status).toBe(200)
    const gone = await t.api.call('GET', `/v1/sessions/${session}/snapshots/${snapshotId}`)
    expect(gone.status).toBe(404)
    expect((await t.api.call('DELETE', `/v1/sessions/${session}/snapshots/${snapshotId}`)).status).toBe(404)
    // Another tenant cannot delete it (nor learn it exists).
    const other = (await t.api.call('POST', `/v1/sessions/${session}/snapshots`, {})).body.id
    expect((await tenantB.call('DELETE', `/v1/sessions/${session}/snapshots/${other}`)).status).toBe(404)
  })

  it("copies into the artifact store (beside the database) count with the tenant's trees against its quota", async () => {
    const session = (await tenantB.createSession('filler')).id
    expect((await tenantB.send(session, 'write art.bin 30')).text).toBe('wrote art.bin\n')
    const save = () => tenantB.call('POST', `/v1/sessions/${session}/artifacts`, { path: 'art.bin' })
    // The tenant's trees hold the 30 MiB file (and what earlier cases left): one copy fits in 80 MiB, a second does not.
    expect((await save()).status).toBe(201)
    const second = await save()
    expect(second.status).toBe(507)
    expect(second.body.error.code).toBe('quota_exceeded')
    const { poolBytes, artifactBytes } = second.body.error.details
    expect(poolBytes).toBeGreaterThanOrEqual(30 * MiB)
    expect(artifactBytes).toBe(30 * MiB)
    expect(poolBytes + artifactBytes + 30 * MiB).toBeGreaterThan(TENANT_MIB * MiB)
    // Refused before copying: the data disk holds the one copy and nothing else.
    const listed = await tenantB.call('GET', `/v1/agents/filler/artifacts`)
    expect(listed.body.data).toHaveLength(1)
    const agentDirs = await readdir(path.join(t.dataDir, 'artifacts'))
    const files = (
      await Promise.all(agentDirs.map((d) => readdir(path.join(t.dataDir, 'artifacts', d))))
    ).flat()
    expect(files).toHaveLength(1)
  })

  it('exposes the pool fill and each tenant’s usage in /metrics', async () => {
    const text = await (await fetch(`${t.url}/metrics`)).text()
    for (const state of ['total', 'used', 'free'])
      expect(text).toMatch(new RegExp(`^cairn_pool_bytes\\{state="${state}"\\} \\d+$`, 'm'))
    expect(text).toMatch(/^cairn_tenant_storage_bytes\{tenant="tnt_[0-9a-z]+",kind="exclusive"\} [1-9]\d*$/m)
    expect(text).toMatch(/^cairn_pool_quota_bytes\{limit="tenant"\} 83886080$/m)
  })
})

describe('btrfs: the reserve', () => {
  let t: TestServer

  beforeAll(async () => {
    // Per-workspace and per-tenant limits off: only the agents' total (pool less reserve) holds.
    t = await startTestServer({
      server: { workspaceQuotaMiB: 0, tenantQuotaMiB: 0, poolReserveMiB: 896 },
    })
    expect((await t.api.deploy(await makeProject(FILLER))).status).toBe(201)
  })

  afterAll(async () => {
    await closeOwned(t)
  })

  it("agents together never take the reserve: the filler gets quota_exceeded, Cairn's own writes go on", async () => {
    const session = (await t.api.createSession('filler')).id
    const filled = await t.api.send(session, 'fill')
    expect(failure(filled)?.code).toBe('quota_exceeded')
    const { freeBytes } = await t.server.runtime.pool.poolStats()
    expect(freeBytes).toBeGreaterThan(880 * MiB)
    // Snapshots and the transcript still work; a new session is refused with the typed code (the
    // agents' share is used up) and leaves nothing behind in the pool.
    expect((await t.api.call('POST', `/v1/sessions/${session}/snapshots`, {})).status).toBe(201)
    const messages = await t.api.call('GET', `/v1/sessions/${session}/messages`)
    expect(messages.body.data.map((m: { status?: string }) => m.status ?? 'user')).toEqual(['user', 'failed'])
    const sessionsBefore = await t.server.runtime.pool.listArea('sessions')
    const refused = await t.api.call('POST', '/v1/sessions', { agent: 'filler' })
    expect(refused.status).toBe(507)
    expect(refused.body.error.code).toBe('quota_exceeded')
    // A 507 its OpenAPI document did not list for the route.
    expect(await undocumentedAnswer(t.url, 'POST', '/v1/sessions', refused)).toBeUndefined()
    expect(await t.server.runtime.pool.listArea('sessions')).toEqual(sessionsBefore)
  })
})

describe('dir: cannot enforce quotas, and says so', () => {
  let t: TestServer

  beforeAll(async () => {
    t = await startTestServer({ server: { storage: 'dir' } })
  })

  afterAll(async () => {
    await closeOwned(t)
  })

  it('reports quotas_unavailable in GET /v1/runtime instead of pretending to limit', async () => {
    const runtime = await t.api.call('GET', '/v1/runtime')
    expect(runtime.body.storage).toMatchObject({
      driver: 'dir',
      capabilities: { quotas: false },
      quotas: { enforced: false },
      warnings: [{ code: 'quotas_unavailable', message: expect.stringContaining('cannot limit') }],
    })
  })
})

/** The key of an image built before the images' group existed (a Debian recipe's hash, made up). */
const LEGACY_IMAGE = `debian-${'ab'.repeat(32)}`

describe('btrfs: simple quotas keep the figures exact', () => {
  it("runs simple quotas, and a tree made behind Cairn's back leaves nothing to rescan", async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-quota-exact-'))
    const mountPoint = path.join(dataDir, 'mnt')
    try {
      const first = await startTestServer({ dataDir })
      expect((await first.api.deploy(await makeProject(FILLER))).status).toBe(201)
      const revision = (await first.server.runtime.pool.listArea('revisions'))[0]
      const { storage } = (await first.api.call('GET', '/v1/runtime')).body
      expect(storage.quotas).toMatchObject({ enforced: true, accounting: 'simple' })
      expect(storage.warnings).toEqual([])
      const key = first.key
      await closeOwned(first)
      // Behind Cairn's back: a snapshot of a tenant's tree placed in no group at all. With full
      // qgroups this marks the figures inconsistent (a rescan, reported as quotas_inexact); simple
      // quotas count each extent for the tree that wrote it, so nothing needs a rescan.
      await mkdir(mountPoint)
      await run('mount', ['-o', 'loop', path.join(dataDir, 'pool.img'), mountPoint])
      try {
        await run('btrfs', [
          'subvolume',
          'snapshot',
          path.join(mountPoint, 'revisions', String(revision)),
          path.join(mountPoint, 'stray'),
        ])
        // An image as one built before the images' group existed: in no group.
        await mkdir(path.join(mountPoint, 'images'), { recursive: true })
        await run('btrfs', ['subvolume', 'create', path.join(mountPoint, 'images', LEGACY_IMAGE)])
      } finally {
        await run('umount', [mountPoint])
      }
      const second = await startTestServer({ dataDir })
      try {
        const again = (await new Api(second.url, key).call('GET', '/v1/runtime')).body.storage
        expect(again.quotas).toMatchObject({ enforced: true, accounting: 'simple' })
        expect(again.warnings).toEqual([])
        // The invariant's check names the stray tree alone: the old image joined the images'
        // group at start (before, it stayed in no group).
        const offenders = await (second.server.runtime.pool as BtrfsPool).unownedTrees()
        expect(offenders).toEqual([expect.stringMatching(/^stray \(0\/\d+\) is in no group$/)])
      } finally {
        await second.close()
      }
    } finally {
      await rm(dataDir, { recursive: true, force: true })
    }
  })
})

describe('on every sandbox driver: the agent meets EDQUOT, its turn quota_exceeded, its neighbour nothing', () => {
  let t: TestServer
  let drivers: Awaited<ReturnType<typeof probeDrivers>>

  beforeAll(async () => {
    drivers = await probeDrivers()
    t = await startTestServer({ server: { workspaceQuotaMiB: 24 } })
    for (const isolation of DRIVERS.filter((d) => drivers[d].ok)) {
      const project = await makeProject({
        ...FILLER,
        'cairn.yaml': `name: filler-${isolation}\ncommand: python3 -u filler.py\nisolation: ${isolation}\n`,
      })
      expect((await t.api.deploy(project)).status).toBe(201)
    }
  })

  afterAll(async () => {
    await closeOwned(t)
  })

  for (const isolation of DRIVERS) {
    it(`${isolation}`, async (context) => {
      if (!drivers[isolation].ok) return context.skip()
      const full = (await t.api.createSession(`filler-${isolation}`)).id
      const neighbour = (await t.api.createSession(`filler-${isolation}`)).id
      const filled = await t.api.send(full, 'fill')
      expect(failure(filled)?.code).toBe('quota_exceeded')
      expect(
        statSync(path.join(t.server.runtime.pool.workspacePath(full), 'fill.bin')).size,
      ).toBeLessThanOrEqual(24 * MiB)
      const fine = await t.api.send(neighbour, 'write blob.bin 8')
      expect(fine.terminal?.type).toBe('run.completed')
      expect(fine.text).toBe('wrote blob.bin\n')
    })
  }
})
