import { mkdtemp, readdir, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type GvisorDriver, probeGvisor } from '../packages/runtime/src/sandbox/gvisor-driver.js'
import { listContainers } from '../packages/runtime/src/sandbox/runsc.js'
import { COUNTER_AGENT, NODE_COUNTER_AGENT } from '../packages/runtime/test/counter-agents.js'
import { makeProject } from './helpers/projects.js'
import { Api, startTestServer, type TestServer } from './helpers/server.js'

const KEEP_WARM_MS = 400

const gvisor = await probeGvisor()
if (!gvisor.ok) console.warn(`pause: gVisor cannot run here, its cases are SKIPPED: ${gvisor.reason}`)

let t: TestServer
let dataDir = ''

beforeAll(async () => {
  // Resident pauses off: keep-warm's end checkpoints at once (tier 2 alone), as before them.
  t = await startTestServer({ server: { residentPauses: 0 } })
  dataDir = t.dataDir
})

afterAll(async () => {
  await t?.close()
  // The restarted server was given the data dir, so its close leaves it.
  await rm(dataDir, { recursive: true, force: true })
})

interface Reply {
  count: number
  init: string
  /** Drawn by the agent when it started: a restarted agent has another. */
  token: string
  preview: string
  coldStart: boolean
}

async function ask(api: Api, sessionId: string, prompt: string): Promise<Reply> {
  const run = await api.send(sessionId, prompt)
  expect(run.terminal?.type, JSON.stringify(run.events)).toBe('run.completed')
  const match = /count=(\d+) init=(\d+) token=([0-9a-f]+) preview=(\S+)/.exec(run.text)
  if (!match?.[1] || !match[2] || !match[3] || !match[4]) throw new Error(`unexpected reply: ${run.text}`)
  const started = run.events.find((e) => e.type === 'run.started')
  return {
    count: Number(match[1]),
    init: match[2],
    token: match[3],
    preview: match[4],
    coldStart: started?.type === 'run.started' && started.coldStart,
  }
}

async function events(api: Api, sessionId: string): Promise<{ cause: string; detail: string | null }[]> {
  const res = await api.call('GET', `/v1/sessions/${sessionId}/events`)
  return res.body.data
}

/** Waits for the session's `n`th event of `cause` (the checkpoint runs when keep-warm ends). */
async function eventually(api: Api, sessionId: string, cause: string, n = 1) {
  for (let i = 0; i < 300; i++) {
    const found = (await events(api, sessionId)).filter((e) => e.cause === cause)
    if (found.length >= n) return found[n - 1]
    await new Promise((r) => setTimeout(r, 50))
  }
  throw new Error(
    `no ${cause} event (${n}) for ${sessionId}: ${JSON.stringify(await events(api, sessionId))}`,
  )
}

describe.skipIf(!gvisor.ok)('pause: memory under gVisor', () => {
  beforeAll(async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: counter\ncommand: python3 -u agent.py\nisolation: gvisor\npause: memory\n',
      'agent.py': COUNTER_AGENT,
    })
    expect((await t.api.deploy(project)).status).toBe(201)
  })

  it('restores into a sandbox booted while paused; a dead one leaves the restore to boot; an end drops it', async () => {
    // First of the file: no other session is paused yet, so the driver's targets are this one's.
    const driver = t.server.runtime.drivers.gvisor as GvisorDriver
    const { id } = await t.api.createSession('counter', { keepWarmMs: KEEP_WARM_MS })
    const first = await ask(t.api, id, 'one')
    await eventually(t.api, id, 'memory_paused')
    // Booted as part of the pause (`runsc create`, nothing run in it): the restore loads into it.
    expect(driver.restoreTargets).toBe(1)
    const created = (await listContainers(driver.runsc)).filter((c) => c.status === 'created')
    expect(created).toHaveLength(1)
    expect(await ask(t.api, id, 'two')).toEqual({ ...first, count: 2, coldStart: false })
    expect(driver.restoreTargets).toBe(0)
    expect((await eventually(t.api, id, 'memory_restored')).detail).toBe(created[0]?.id)

    // The next target dies while the session is paused: the restore boots a sandbox instead.
    await eventually(t.api, id, 'memory_paused', 2)
    expect(driver.restoreTargets).toBe(1)
    const [target] = (await listContainers(driver.runsc)).filter((c) => c.status === 'created')
    expect(target?.pid).toBeGreaterThan(0)
    process.kill(target?.pid ?? 0, 'SIGKILL')
    expect(await ask(t.api, id, 'three')).toEqual({ ...first, count: 3, coldStart: false })
    expect(driver.restoreTargets).toBe(0)

    // Ending a paused session destroys its target with its checkpoint: nothing of it runs.
    await eventually(t.api, id, 'memory_paused', 3)
    expect(driver.restoreTargets).toBe(1)
    expect((await t.api.call('POST', `/v1/sessions/${id}/end`)).status).toBe(200)
    expect(driver.restoreTargets).toBe(0)
    expect((await listContainers(driver.runsc)).filter((c) => c.status === 'created')).toEqual([])
  })

  it('restores the sandbox after keep-warm expiry and after a server restart: counter, preview and init intact', async () => {
    const { id } = await t.api.createSession('counter', { keepWarmMs: KEEP_WARM_MS })
    const first = await ask(t.api, id, 'one')
    expect(first).toMatchObject({ count: 1, preview: '200', coldStart: true })

    expect((await eventually(t.api, id, 'memory_paused')).detail).toMatch(
      /^checkpoint of \d+ bytes in \d+ ms/,
    )
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.warm).toBe(false)
    // The checkpoint counts in the tenant's usage until it is restored.
    const usage = (await t.api.call('GET', '/v1/usage')).body.memoryCheckpoints
    expect(usage.count).toBe(1)
    expect(usage.bytes).toBeGreaterThan(0)
    expect(await ask(t.api, id, 'two')).toEqual({ ...first, count: 2, coldStart: false })
    await eventually(t.api, id, 'memory_restored')
    expect((await t.api.call('GET', '/v1/usage')).body.memoryCheckpoints).toEqual({ count: 0, bytes: 0 })

    // Paused again, then the server restarts: the checkpoint is on disk, no sandbox is running.
    await eventually(t.api, id, 'memory_paused', 2)
    const key = t.key
    await t.server.close()
    t = await startTestServer({ dataDir, server: { residentPauses: 0 } })
    // The admin key is printed on the first start only: the restarted server knows the old one.
    t = { ...t, key, api: new Api(t.url, key) }
    expect(await ask(t.api, id, 'three')).toEqual({ ...first, count: 3, coldStart: false })
  })

  it('discards the checkpoint when the workspace changed since (the reason in the events) and starts cold', async () => {
    const { id } = await t.api.createSession('counter', { keepWarmMs: KEEP_WARM_MS })
    const first = await ask(t.api, id, 'one')
    await eventually(t.api, id, 'memory_paused')
    const put = await t.api.call('PUT', `/v1/sessions/${id}/files/content?path=notes.txt`, 'changed', {
      'content-type': 'text/plain',
    })
    expect(put.status).toBe(200)
    const next = await ask(t.api, id, 'two')
    expect(next).toMatchObject({ count: 1, preview: '200', coldStart: true })
    expect(next.token).not.toBe(first.token)
    expect((await eventually(t.api, id, 'memory_discarded')).detail).toMatch(
      /^memory checkpoint discarded: the workspace changed since it was taken \(generation \d+, now \d+/,
    )
  })

  it('restores a Node stdio agent after keep-warm expiry: it reads its next line, its memory intact', async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: node-counter\ncommand: node agent.js\nisolation: gvisor\npause: memory\n',
      'agent.js': NODE_COUNTER_AGENT,
    })
    expect((await t.api.deploy(project)).status).toBe(201)
    const { id } = await t.api.createSession('node-counter', { keepWarmMs: KEEP_WARM_MS })
    const first = await ask(t.api, id, 'one')
    expect(first).toMatchObject({ count: 1, coldStart: true })
    await eventually(t.api, id, 'memory_paused')
    expect(await ask(t.api, id, 'two')).toEqual({ ...first, count: 2, coldStart: false })
    await eventually(t.api, id, 'memory_restored')
    await eventually(t.api, id, 'memory_paused', 2)
    expect(await ask(t.api, id, 'three')).toEqual({ ...first, count: 3, coldStart: false })
  })
})

describe.skipIf(!gvisor.ok)('a session of its own pause (POST /v1/sessions {pause})', () => {
  beforeAll(async () => {
    for (const [name, extra] of [
      ['counter-stop', 'isolation: gvisor\n'],
      ['counter-under-bwrap', 'isolation: bwrap\n'],
      ['counter-memory', 'isolation: gvisor\npause: memory\n'],
    ] as const) {
      const project = await makeProject({
        'cairn.yaml': `name: ${name}\ncommand: python3 -u agent.py\n${extra}`,
        'agent.py': COUNTER_AGENT,
      })
      expect((await t.api.deploy(project)).status).toBe(201)
    }
  })

  it('pause: memory on an agent whose cairn.yaml says stop: checkpointed and restored', async () => {
    const { id } = await t.api.createSession('counter-stop', { keepWarmMs: KEEP_WARM_MS, pause: 'memory' })
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.pause).toBe('memory')
    const first = await ask(t.api, id, 'one')
    await eventually(t.api, id, 'memory_paused')
    expect(await ask(t.api, id, 'two')).toEqual({ ...first, count: 2, coldStart: false })
  })

  it('pause: stop on an agent whose cairn.yaml says memory: stopped, the next message starts cold', async () => {
    const { id } = await t.api.createSession('counter-memory', { keepWarmMs: KEEP_WARM_MS, pause: 'stop' })
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.pause).toBe('stop')
    const first = await ask(t.api, id, 'one')
    for (let i = 0; i < 200 && (await t.api.call('GET', `/v1/sessions/${id}`)).body.warm; i++)
      await new Promise((r) => setTimeout(r, 50))
    const next = await ask(t.api, id, 'two')
    expect(next).toMatchObject({ count: 1, coldStart: true })
    expect(next.token).not.toBe(first.token)
    expect((await events(t.api, id)).map((e) => e.cause)).not.toContain('memory_paused')
  })

  it('refuses pause: memory for an agent under bwrap, typed, with the reason, and creates nothing', async () => {
    const before = (await t.api.call('GET', '/v1/sessions?agent=counter-under-bwrap')).body.data.length
    const res = await t.api.call('POST', '/v1/sessions', { agent: 'counter-under-bwrap', pause: 'memory' })
    expect(res.status).toBe(400)
    expect(res.body).toMatchObject({
      error: { code: 'bad_request', details: { driver: 'bwrap', capability: 'memorySnapshot' } },
    })
    expect(res.body.error.details.reason).toMatch(/CRIU.*; this node keeps no sandbox frozen/)
    expect((await t.api.call('GET', '/v1/sessions?agent=counter-under-bwrap')).body.data.length).toBe(before)
    const bad = await t.api.call('POST', '/v1/sessions', { agent: 'counter-under-bwrap', pause: 'sleep' })
    expect(bad.status).toBe(400)
  })
})

describe.skipIf(!gvisor.ok)('memory checkpoints and retention', () => {
  it('ages a paused session checkpoint out (memoryCheckpointTtlMs): freed, recorded, and the next message starts cold', async () => {
    const node = await startTestServer({
      server: { memoryCheckpointTtlMs: 0, reaperIntervalMs: 3_600_000, residentPauses: 0 },
    })
    try {
      const project = await makeProject({
        'cairn.yaml': 'name: counter\ncommand: python3 -u agent.py\nisolation: gvisor\npause: memory\n',
        'agent.py': COUNTER_AGENT,
      })
      expect((await node.api.deploy(project)).status).toBe(201)
      const { id } = await node.api.createSession('counter', { keepWarmMs: KEEP_WARM_MS })
      const first = await ask(node.api, id, 'one')
      await eventually(node.api, id, 'memory_paused')
      const held = (await node.api.call('GET', '/v1/usage')).body.memoryCheckpoints
      expect(held.count).toBe(1)

      const applied = await node.server.retention.apply()
      expect(applied.memoryCheckpoints).toBe(1)
      expect(applied.bytesFreed).toBeGreaterThanOrEqual(held.bytes)
      const usage = (await node.api.call('GET', '/v1/usage')).body
      expect(usage.memoryCheckpoints).toEqual({ count: 0, bytes: 0 })
      expect(usage.retention.bytesFreed).toBeGreaterThanOrEqual(held.bytes)
      expect((await eventually(node.api, id, 'memory_discarded')).detail).toMatch(
        /^memory checkpoint discarded by retention: taken more than 0 ms ago/,
      )
      const next = await ask(node.api, id, 'two')
      expect(next).toMatchObject({ count: 1, coldStart: true })
      expect(next.token).not.toBe(first.token)
    } finally {
      await node.close()
    }
  })
})

describe.skipIf(!gvisor.ok)(
  'pause: memory on a node whose default is gVisor (its pool of booted sandboxes on)',
  () => {
    it('boots pausing sandboxes on demand, so their checkpoints restore', async () => {
      const node = await startTestServer({
        server: { isolation: 'gvisor', gvisorPoolSize: 1, residentPauses: 0 },
      })
      try {
        const project = await makeProject({
          'cairn.yaml': 'name: counter\ncommand: python3 -u agent.py\npause: memory\n',
          'agent.py': COUNTER_AGENT,
        })
        expect((await node.api.deploy(project)).status).toBe(201)
        // A first session of this layout has the pool keep a booted slot of it.
        const warmer = await node.api.createSession('counter', { keepWarmMs: 0 })
        await ask(node.api, warmer.id, 'one')
        const driver = node.server.runtime.drivers.gvisor as GvisorDriver
        for (let i = 0; i < 100 && driver.pooled === 0; i++) await new Promise((r) => setTimeout(r, 100))
        expect(driver.pooled).toBeGreaterThan(0)
        const { id } = await node.api.createSession('counter', { keepWarmMs: KEEP_WARM_MS })
        const first = await ask(node.api, id, 'one')
        await eventually(node.api, id, 'memory_paused')
        expect(await ask(node.api, id, 'two')).toEqual({ ...first, count: 2, coldStart: false })
      } finally {
        await node.close()
      }
    })
  },
)

describe('pause: memory where the driver cannot checkpoint', () => {
  it('refuses the deploy with the driver, the capability and why', async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: counter-bwrap\ncommand: python3 -u agent.py\npause: memory\n',
      'agent.py': COUNTER_AGENT,
    })
    const res = await t.api.deploy(project)
    expect(res.status).toBe(400)
    expect(res.body.error).toMatchObject({
      code: 'invalid_manifest',
      details: { driver: 'bwrap', capability: 'memorySnapshot' },
    })
    expect(res.body.error.details.reason).toMatch(/CRIU/)
    const agents = await t.api.call('GET', '/v1/agents')
    expect(agents.body.data.map((a: { name: string }) => a.name)).not.toContain('counter-bwrap')
  })
})

// Freezer, markers and releases are the runtime's; the session events they write are the same
// store calls as the cases above, which the PostgreSQL pass runs: that pass skips this block (CI time).
describe.skipIf(process.env.CAIRN_TEST_DATABASE === 'postgres')(
  'resident pauses: frozen in place, thawed by the next message, released by the bounds',
  () => {
    // Its own server and data dir: resident pauses on, at most 2 frozen (the third releases the oldest).
    let r: TestServer
    let residentDir = ''
    const drivers = gvisor.ok ? (['bwrap', 'gvisor'] as const) : (['bwrap'] as const)

    beforeAll(async () => {
      residentDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-resident-'))
      r = await startTestServer({
        dataDir: residentDir,
        server: { residentPauses: 2, residentPauseMs: 600_000 },
      })
      for (const driver of drivers) {
        const project = await makeProject({
          'cairn.yaml': `name: counter-${driver}\ncommand: python3 -u agent.py\nisolation: ${driver}\npause: memory\n`,
          'agent.py': COUNTER_AGENT,
        })
        expect((await r.api.deploy(project)).status).toBe(201)
      }
    })

    afterAll(async () => {
      await r?.close()
      await rm(residentDir, { recursive: true, force: true })
    })

    async function pausedSession(driver: string): Promise<{ id: string; first: Reply }> {
      const { id } = await r.api.createSession(`counter-${driver}`, { keepWarmMs: KEEP_WARM_MS })
      const first = await ask(r.api, id, 'one')
      expect((await eventually(r.api, id, 'memory_paused')).detail).toMatch(
        /^resident: frozen in place in \d+ ms/,
      )
      // Warm still: its next message starts no sandbox (it thaws it).
      expect((await r.api.call('GET', `/v1/sessions/${id}`)).body.warm).toBe(true)
      return { id, first }
    }

    it('GET /v1/runtime states what each driver claims: bwrap resident only, gVisor resident then checkpoint', async () => {
      const listed = (await r.api.call('GET', '/v1/runtime')).body.drivers
      const bwrap = listed.find((d: { name: string }) => d.name === 'bwrap')
      expect(bwrap.capabilities).toMatchObject({ residentPause: true, memorySnapshot: false })
      expect(bwrap.capabilityReasons.memorySnapshot).toMatch(/CRIU/)
      const gv = listed.find((d: { name: string }) => d.name === 'gvisor')
      if (gvisor.ok) expect(gv.capabilities).toMatchObject({ residentPause: true, memorySnapshot: true })
      const off = (await t.api.call('GET', '/v1/runtime')).body.drivers
      expect(off.find((d: { name: string }) => d.name === 'bwrap').capabilities.residentPause).toBe(false)
    })

    it.each(drivers)(
      '%s: the counter and the preview process survive a resident pause; a message racing the pause too',
      async (driver) => {
        const { id, first } = await pausedSession(driver)
        expect(await ask(r.api, id, 'two')).toEqual({ ...first, count: 2, coldStart: false })
        expect((await eventually(r.api, id, 'memory_restored')).detail).toMatch(
          /^resident: thawed in place after \d+ ms frozen/,
        )
        expect((await r.api.call('DELETE', `/v1/sessions/${id}`)).status).toBe(200)
        // Messages sent as keep-warm (1 ms) ends: warm, freezing or frozen, each finds the memory.
        const racing = (await r.api.createSession(`counter-${driver}`, { keepWarmMs: 1 })).id
        const cold = await ask(r.api, racing, 'one')
        for (let n = 2; n <= 4; n++)
          expect(await ask(r.api, racing, String(n))).toEqual({ ...cold, count: n, coldStart: false })
        expect((await r.api.call('DELETE', `/v1/sessions/${racing}`)).status).toBe(200)
      },
    )

    it('releases the oldest beyond the bound: bwrap starts cold with the reason, gVisor restores its checkpoint', async () => {
      const paused = []
      for (const driver of drivers) paused.push({ driver, ...(await pausedSession(driver)) })
      // One more than the bound (2) when gVisor runs: the bwrap session, the oldest, is released.
      const extra = drivers.length === 2 ? [] : [await pausedSession('bwrap')]
      const more = await pausedSession('bwrap')
      const [oldBwrap, oldGvisor] = paused
      if (!oldBwrap) throw new Error('no bwrap session')
      expect((await eventually(r.api, oldBwrap.id, 'memory_discarded')).detail).toMatch(
        /^memory released, its sandbox stopped: the node keeps at most 2 sandboxes frozen.*bwrap keeps no checkpoint, so the next message starts cold/,
      )
      const cold = await ask(r.api, oldBwrap.id, 'two')
      expect(cold).toMatchObject({ count: 1, coldStart: true })
      expect(cold.token).not.toBe(oldBwrap.first.token)
      if (oldGvisor) {
        // The cold start above paused nothing yet; the next pause releases gVisor's: a checkpoint.
        await eventually(r.api, oldBwrap.id, 'memory_paused', 2)
        expect((await eventually(r.api, oldGvisor.id, 'memory_paused', 2)).detail).toMatch(
          /^checkpoint of \d+ bytes in \d+ ms at generation \d+ \(the node keeps at most 2/,
        )
        expect(await ask(r.api, oldGvisor.id, 'two')).toEqual({
          ...oldGvisor.first,
          count: 2,
          coldStart: false,
        })
      }
      for (const s of [...paused, ...extra, more]) await r.api.call('DELETE', `/v1/sessions/${s.id}`)
    })

    it('a delete of a frozen session ends its sandbox; a restart names what it lost (bwrap) or restores (gVisor)', async () => {
      const gone = await pausedSession('bwrap')
      expect((await r.api.call('DELETE', `/v1/sessions/${gone.id}`)).status).toBe(200)
      expect(await readdir(path.join(residentDir, 'resident-pauses'))).not.toContain(`${gone.id}.json`)
      const paused = []
      for (const driver of drivers) paused.push({ driver, ...(await pausedSession(driver)) })
      const key = r.key
      await r.server.close()
      r = await startTestServer({
        dataDir: residentDir,
        server: { residentPauses: 2, residentPauseMs: 600_000 },
      })
      r = { ...r, key, api: new Api(r.url, key) }
      for (const s of paused) {
        const next = await ask(r.api, s.id, 'two')
        if (s.driver === 'gvisor') expect(next).toEqual({ ...s.first, count: 2, coldStart: false })
        else {
          expect(next).toMatchObject({ count: 1, coldStart: true })
          expect((await eventually(r.api, s.id, 'memory_discarded')).detail).toMatch(
            /^memory lost, started cold: its sandbox was frozen in place \(a resident pause, bwrap since .*\) when the server stopped, and bwrap keeps no checkpoint/,
          )
        }
      }
    })
  },
)
