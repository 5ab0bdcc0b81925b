import { mkdir, rm, truncate, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { COUNTER_AGENT, NODE_COUNTER_AGENT } from '../../test/counter-agents.js'
import { makeRevision, openTestRuntime, reply, sessionId, type TestRuntime } from '../../test/harness.js'
import type { AgentProcess } from '../agent/agent-process.js'
import type { AgentLaunch } from '../agent/types.js'
import { Runtime } from '../runtime.js'
import { probeGvisor } from '../sandbox/gvisor-driver.js'
import { MemoryCheckpoints, startFromCheckpoint } from './memory-checkpoints.js'

const REVISION = 'rev_memcheckpoints'
const gvisor = await probeGvisor()
if (!gvisor.ok) console.warn(`memory checkpoints: gVisor cannot run here, cases SKIPPED: ${gvisor.reason}`)

let t: TestRuntime
let runtime: Runtime
let checkpoints: MemoryCheckpoints

beforeAll(async () => {
  t = await openTestRuntime()
  runtime = t.runtime
  checkpoints = new MemoryCheckpoints(path.join(t.dataDir, 'checkpoints'))
  await makeRevision(runtime, REVISION, { 'README.md': 'counter\n' })
})

afterAll(async () => {
  await runtime.close()
  await rm(t.dataDir, { recursive: true, force: true })
})

async function launchFor(isolation: 'gvisor' | 'bwrap'): Promise<AgentLaunch> {
  const id = sessionId('m')
  return {
    sessionId: id,
    workspaceDir: await runtime.pool.createWorkspace(id, REVISION),
    command: ['python3', '-u', '-c', COUNTER_AGENT],
    protocol: 'stdio',
    env: {},
    limits: { memoryMiB: 256, pids: 64, cpus: 1 },
    turnTimeoutMs: 20_000,
    isolation,
    // As LocalRuntimePort starts a `pause: memory` agent.
    checkpointable: isolation === 'gvisor',
  }
}

function parse(text: string): { count: number; init: string; token: string; preview: string } {
  const match = /count=(\d+) init=(\d+) token=([0-9a-f]+) preview=(.+)/.exec(text)
  if (!match?.[1] || !match[2] || !match[3] || !match[4]) throw new Error(`unexpected reply: ${text}`)
  return { count: Number(match[1]), init: match[2], token: match[3], preview: match[4].trim() }
}

const start = (launch: AgentLaunch) => runtime.startAgent(launch)

describe.skipIf(!gvisor.ok)('memory checkpoints under gVisor', () => {
  it('restores the agent where it was: its counter, its preview and its init, after a runtime restart too', async () => {
    const launch = await launchFor('gvisor')
    let agent: AgentProcess = await start(launch)
    const first = parse(await reply(agent, 'hi', 1))
    expect(first).toMatchObject({ count: 1, preview: '200' })
    await reply(agent, 'hi', 2)

    const manifest = await checkpoints.save(launch.sessionId, agent, 1)
    expect(agent.alive).toBe(false)
    expect(manifest.bytes).toBeGreaterThan(0)
    expect(await checkpoints.bytes(launch.sessionId)).toBe(manifest.bytes)

    const resumed = await startFromCheckpoint(checkpoints, start, launch, { generation: 1, driver: 'gvisor' })
    expect(resumed.coldReason).toBeUndefined()
    expect(resumed.resumed).toBe(true)
    agent = resumed.agent
    expect(parse(await reply(agent, 'hi', 3))).toEqual({ ...first, count: 3 })
    // Used once: the restored sandbox has moved on from it.
    expect(await checkpoints.bytes(launch.sessionId)).toBe(0)

    // A restart of the runtime (the server's): the checkpoint is on disk, the sandbox is not.
    await checkpoints.save(launch.sessionId, agent, 1)
    await runtime.close()
    runtime = new Runtime({ dataDir: t.dataDir, poolImageSizeBytes: 512 * 1024 * 1024 })
    await runtime.open()
    const afterRestart = await startFromCheckpoint(checkpoints, start, launch, {
      generation: 1,
      driver: 'gvisor',
    })
    expect(afterRestart.resumed).toBe(true)
    expect(parse(await reply(afterRestart.agent, 'hi', 4))).toEqual({ ...first, count: 4 })
    await runtime.stopAgent(afterRestart.agent)
  })

  it('restores a Node stdio agent (the node shim, readline) with its memory, and it reads its next line', async () => {
    const launch = { ...(await launchFor('gvisor')), command: ['node', '-e', NODE_COUNTER_AGENT] }
    let agent: AgentProcess = await start(launch)
    const first = parse(await reply(agent, 'hi', 1))
    expect(first.count).toBe(1)
    // Idle long enough to be waiting for stdin in epoll_wait (checkpointed mid-turn-end it resumed fine).
    await new Promise((r) => setTimeout(r, 1000))
    await checkpoints.save(launch.sessionId, agent, 1)
    const resumed = await startFromCheckpoint(checkpoints, start, launch, { generation: 1, driver: 'gvisor' })
    expect(resumed.resumed).toBe(true)
    agent = resumed.agent
    expect(parse(await reply(agent, 'hi', 2))).toEqual({ ...first, count: 2 })
    expect(parse(await reply(agent, 'hi', 3))).toEqual({ ...first, count: 3 })
    await runtime.stopAgent(agent)
  })

  it('discards a checkpoint taken at an older workspace generation, and says why', async () => {
    const launch = await launchFor('gvisor')
    const agent = await start(launch)
    await reply(agent, 'hi', 1)
    await checkpoints.save(launch.sessionId, agent, 1)
    const cold = await startFromCheckpoint(checkpoints, start, launch, { generation: 2, driver: 'gvisor' })
    expect(cold.resumed).toBe(false)
    expect(cold.coldReason).toMatch(/workspace changed since it was taken \(generation 1, now 2/)
    expect(parse(await reply(cold.agent, 'hi', 1)).count).toBe(1)
    expect(await checkpoints.bytes(launch.sessionId)).toBe(0)
    await runtime.stopAgent(cold.agent)
  })

  it('falls back to a cold start with the reason when the restore fails', async () => {
    const launch = await launchFor('gvisor')
    const agent = await start(launch)
    await reply(agent, 'hi', 1)
    await checkpoints.save(launch.sessionId, agent, 1)
    const image = path.join(checkpoints.dir(launch.sessionId), 'checkpoint.img')
    await truncate(image, 4096)
    const cold = await startFromCheckpoint(checkpoints, start, launch, { generation: 1, driver: 'gvisor' })
    expect(cold.resumed).toBe(false)
    expect(cold.coldReason).toMatch(/^memory checkpoint restore failed, started cold: runsc restore/)
    expect(parse(await reply(cold.agent, 'hi', 1)).count).toBe(1)
    expect(await checkpoints.bytes(launch.sessionId)).toBe(0)
    await runtime.stopAgent(cold.agent)
  })

  it('treats an unreadable manifest as no checkpoint to restore, with the reason', async () => {
    const launch = await launchFor('gvisor')
    const dir = checkpoints.dir(launch.sessionId)
    await mkdir(dir, { recursive: true })
    await writeFile(path.join(dir, 'manifest.json'), '{not json')
    expect(await checkpoints.find(launch.sessionId, 1, 'gvisor')).toEqual({
      kind: 'discarded',
      reason: 'memory checkpoint discarded: its manifest is unreadable',
    })
  })
})

describe('memory checkpoints under bwrap', () => {
  it('are refused with a typed error naming the driver and the capability', async () => {
    const launch = await launchFor('bwrap')
    const agent = await start(launch)
    await reply(agent, 'hi', 1)
    const refusal = await checkpoints.save(launch.sessionId, agent, 1).catch((e: unknown) => e)
    expect(refusal).toBeInstanceOf(CairnProblem)
    expect(refusal).toMatchObject({
      code: 'bad_request',
      details: { driver: 'bwrap', capability: 'memorySnapshot' },
    })
    // The refusal stops nothing: the agent goes on.
    expect(parse(await reply(agent, 'hi', 2)).count).toBe(2)
    expect(await checkpoints.bytes(launch.sessionId)).toBe(0)
    await runtime.stopAgent(agent)
  })
})
