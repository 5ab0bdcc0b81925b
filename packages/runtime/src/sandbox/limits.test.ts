import { existsSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  instanceProcesses,
  liveSandboxCgroups,
  makeRevision,
  openTestRuntime,
  poolMounts,
  reply,
  sandboxCgroupDirs,
  startAgent,
  type TestRuntime,
  turn,
} from '../../test/harness.js'
import type { AgentProcess } from '../agent/agent-process.js'

const LIMITS_AGENT = `import os, time
print("limits agent starting")
while True:
    line = input()
    if line.startswith("write "):
        with open("state.txt", "w") as f:
            f.write(line[6:] + "\\n")
        print("saved")
    elif line == "read":
        print(open("state.txt").read(), end="")
    elif line.startswith("alloc "):
        print("allocating", flush=True)
        blocks = [b"\\x01" * (1 << 20) for _ in range(int(line[6:]))]
        print("allocated", len(blocks))
    elif line.startswith("fork "):
        started = 0
        for _ in range(int(line[5:])):
            try:
                pid = os.fork()
            except OSError as e:
                print("fork failed after", started, type(e).__name__, flush=True)
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            started += 1
        time.sleep(60)
    elif line == "limits":
        print(os.getpid())
    else:
        print("unknown", line)
`

let t: TestRuntime

beforeAll(async () => {
  t = await openTestRuntime()
  await makeRevision(t.runtime, 'rev_limits', { 'agent.py': LIMITS_AGENT })
})

afterAll(async () => {
  const runtime = t.runtime
  await t.close()
  expect(poolMounts(runtime)).toBe(0)
})

/**
 * Asserts that nothing of the sandbox is left on the host: no process, no cgroup. `zombies`: also
 * no zombie, which holds when the runtime did the killing (see `instanceProcesses`).
 */
function expectSandboxGone(agent: AgentProcess, zombies: boolean, before: number[]): void {
  expect(agent.alive).toBe(false)
  for (const dir of sandboxCgroupDirs(t.runtime, agent.sandboxId)) expect(existsSync(dir), dir).toBe(false)
  expect(liveSandboxCgroups(t.runtime)).toEqual([])
  expect(instanceProcesses(t.runtime, { zombies, except: before })).toEqual([])
}

/** A fresh AgentProcess on the same workspace still works and finds the state saved before. */
async function expectWorkspaceUsable(workspaceDir: string): Promise<void> {
  const { agent } = await startAgent(t.runtime, 'rev_limits', ['python3', 'agent.py'], { workspaceDir })
  try {
    expect(await reply(agent, 'read', 1)).toBe('saved before the limit\n')
    expect(await reply(agent, 'alloc 8', 2)).toBe('allocating\nallocated 8\n')
  } finally {
    await t.runtime.stopAgent(agent)
  }
  expect(readFileSync(path.join(workspaceDir, 'state.txt'), 'utf8')).toBe('saved before the limit\n')
}

describe('sandbox limits', () => {
  it('applies memory, pids and cpu limits to the sandbox cgroup', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_limits', ['python3', 'agent.py'], {
      memoryMiB: 96,
      pids: 24,
      cpus: 0.5,
    })
    try {
      await reply(agent, 'limits', 1)
      const [, memory, pids, cpu] = sandboxCgroupDirs(t.runtime, agent.sandboxId)
      expect(readFileSync(path.join(memory ?? '', 'memory.limit_in_bytes'), 'utf8').trim()).toBe(
        String(96 << 20),
      )
      expect(readFileSync(path.join(pids ?? '', 'pids.max'), 'utf8').trim()).toBe('24')
      expect(readFileSync(path.join(cpu ?? '', 'cpu.cfs_quota_us'), 'utf8').trim()).toBe('50000')
      expect(readFileSync(path.join(cpu ?? '', 'cpu.cfs_period_us'), 'utf8').trim()).toBe('100000')
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('fails the turn with memory_limit when the agent allocates past memoryMiB', async () => {
    const { agent, workspaceDir } = await startAgent(t.runtime, 'rev_limits', ['python3', 'agent.py'], {
      memoryMiB: 64,
    })
    try {
      expect(await reply(agent, 'write saved before the limit', 1)).toBe('saved\n')
      const before = instanceProcesses(t.runtime, { zombies: true })
      const { outcome } = await turn(agent, 'alloc 400', 2)
      expect(outcome).toMatchObject({
        status: 'failed',
        code: 'limit_exceeded',
        cause: 'memory_limit',
        text: 'allocating\n',
      })
      // The kernel killed the agent; bwrap's init may linger as a zombie for the host to reap.
      expectSandboxGone(agent, false, before)
    } finally {
      await t.runtime.stopAgent(agent)
    }
    await expectWorkspaceUsable(workspaceDir)
  })

  it('fails the turn with pids_limit when the agent forks past its pids limit, and kills every process', async () => {
    const { agent, workspaceDir } = await startAgent(t.runtime, 'rev_limits', ['python3', 'agent.py'], {
      pids: 16,
    })
    try {
      expect(await reply(agent, 'write saved before the limit', 1)).toBe('saved\n')
      const before = instanceProcesses(t.runtime, { zombies: true })
      const { outcome } = await turn(agent, 'fork 500', 2)
      expect(outcome).toMatchObject({ status: 'failed', code: 'limit_exceeded', cause: 'pids_limit' })
      expect(outcome.text).toMatch(/^fork failed after \d+ BlockingIOError\n$/)
      expectSandboxGone(agent, true, before)
    } finally {
      await t.runtime.stopAgent(agent)
    }
    await expectWorkspaceUsable(workspaceDir)
  })

  it('stops a bash fork bomb at its pids limit and leaves nothing behind', async () => {
    const { agent, workspaceDir } = await startAgent(
      t.runtime,
      'rev_limits',
      ['bash', '-c', 'cat >/dev/null; bomb() { bomb | bomb & }; bomb; sleep 30'],
      { protocol: 'exec', pids: 32 },
    )
    const before = instanceProcesses(t.runtime, { zombies: true })
    try {
      const { outcome } = await turn(agent, 'go', 1)
      expect(outcome).toMatchObject({ status: 'failed', code: 'limit_exceeded', cause: 'pids_limit' })
      expect(liveSandboxCgroups(t.runtime)).toEqual([])
      expect(instanceProcesses(t.runtime, { zombies: true, except: before })).toEqual([])
    } finally {
      await t.runtime.stopAgent(agent)
    }
    expect(readFileSync(path.join(workspaceDir, 'agent.py'), 'utf8')).toBe(LIMITS_AGENT)
  })
})
