import { existsSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { Runtime } from '../../packages/runtime/src/runtime.js'
import {
  DRIVERS,
  gvisorLeftovers,
  instanceProcesses,
  liveSandboxCgroups,
  makeRevision,
  probeDrivers,
  reply,
  startOn,
  waitFor,
} from './harness.js'

const POOL_BYTES = 512 * 1024 * 1024
const drivers = await probeDrivers()
let dataDir: string
const opened: Runtime[] = []

function newRuntime(isolation?: 'bwrap' | 'gvisor'): Runtime {
  const runtime = new Runtime({ dataDir, poolImageSizeBytes: POOL_BYTES, isolation })
  opened.push(runtime)
  return runtime
}

beforeAll(async () => {
  dataDir = await mkdtemp(path.join(tmpdir(), 'cairn-conf-rec-'))
  const runtime = newRuntime()
  await runtime.open()
  await makeRevision(runtime, 'rev_rec', { 'agent.py': 'while True:\n    print("re:", input())\n' })
  await runtime.close()
})

afterAll(async () => {
  for (const runtime of opened.reverse()) await runtime.close().catch(() => undefined)
  await rm(dataDir, { recursive: true, force: true })
})

describe.each(DRIVERS)('%s driver: recovery', (isolation) => {
  it.skipIf(!drivers[isolation].ok).each([
    ['running', false],
    // A crash during a snapshot: under gVisor a frozen sandbox makes every runsc command wait.
    ['frozen', true],
  ])(
    'a runtime that died leaves sandboxes (%s) the next one reaps, and the workspace resumes',
    async (_state, frozen) => {
      const crashed = newRuntime()
      await crashed.open()
      const { agent, workspaceDir } = await startOn(crashed, isolation, 'rev_rec', ['python3', 'agent.py'])
      expect(await reply(agent, 'before', 1)).toBe('re: before\n')
      if (frozen) await agent.freeze()
      const orphans = instanceProcesses(crashed)
      expect(orphans.length).toBeGreaterThan(0)
      // `crashed` is never closed: a new process of the same instance takes over.

      const runtime = newRuntime()
      expect(await runtime.open()).toEqual({ orphansReaped: 1 })
      expect(liveSandboxCgroups(runtime)).toEqual([])
      expect(instanceProcesses(runtime)).toEqual([])
      // Killed processes whose parent died with them are reaped by the host's PID 1, within seconds.
      expect(await waitFor(() => instanceProcesses(runtime, { zombies: true }).length === 0, 10_000)).toBe(
        true,
      )
      for (const pid of orphans) expect(existsSync(`/proc/${pid}`), `pid ${pid}`).toBe(false)
      expect(gvisorLeftovers(runtime)).toEqual([])

      const again = await startOn(runtime, isolation, 'rev_rec', ['python3', 'agent.py'], { workspaceDir })
      expect(await reply(again.agent, 'after', 1)).toBe('re: after\n')
      await runtime.close()
      expect(liveSandboxCgroups(runtime)).toEqual([])
    },
  )
})

describe('default isolation', () => {
  it.skipIf(!drivers.gvisor.ok)('runs agents that do not choose under the runtime default', async () => {
    const runtime = newRuntime('gvisor')
    await runtime.open()
    try {
      expect(runtime.driver.name).toBe('gvisor')
      const id = 'ses_confdefault'
      const workspaceDir = await runtime.pool.createWorkspace(id, 'rev_rec')
      const agent = await runtime.startAgent({
        sessionId: id,
        workspaceDir,
        command: ['python3', 'agent.py'],
        protocol: 'stdio',
        env: {},
        limits: { memoryMiB: 128, pids: 32, cpus: 1 },
        turnTimeoutMs: 20_000,
      })
      expect(agent.isolation).toBe('gvisor')
      expect(await reply(agent, 'default', 1)).toBe('re: default\n')
    } finally {
      await runtime.close()
    }
  })
})
