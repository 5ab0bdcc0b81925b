import { readFileSync, statSync } from 'node:fs'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { AgentProcess } from '../../packages/runtime/src/agent/agent-process.js'
import type { AgentEvent } from '../../packages/runtime/src/agent/types.js'
import type { SandboxDriver } from '../../packages/runtime/src/sandbox/driver.js'
import {
  DRIVERS,
  instanceProcesses,
  limitCgroupDirs,
  liveSandboxCgroups,
  makeRevision,
  openTestRuntime,
  probeDrivers,
  reply,
  sandboxCgroupName,
  startOn,
  type TestRuntime,
  turn,
  waitFor,
} from './harness.js'

// One stdio agent understands every message the suite sends; `count` shows in-memory state.
const AGENT = `import os, time
print("conformance agent starting")
count = 0
while True:
    line = input()
    count += 1
    if line.startswith("write "):
        with open("notes.txt", "w") as f:
            f.write(line[6:] + "\\n")
        print("wrote")
    elif line == "read":
        print(open("notes.txt").read(), end="")
    elif line == "count":
        print(count)
    elif line == "crash":
        print("partial output", flush=True)
        raise RuntimeError("boom from the agent")
    elif line.startswith("alloc "):
        print("allocating", flush=True)
        blocks = [b"\\x01" * (1 << 20) for _ in range(int(line[6:]))]
        print("allocated", len(blocks))
    elif line.startswith("fork "):
        for _ in range(int(line[5:])):
            try:
                pid = os.fork()
            except OSError as e:
                print("fork failed", type(e).__name__, flush=True)
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
        time.sleep(60)
    elif line.startswith("spin "):
        end = time.time() + float(line[5:])
        while time.time() < end:
            pass
        print("spun")
    elif line == "ticker":
        print("ticking", flush=True)
        n = 0
        while True:
            n += 1
            with open("ticks.txt", "a") as f:
                f.write(f"{n}\\n")
            time.sleep(0.005)
    else:
        print("echo:", line)
`

const JSONL_AGENT = `import json, sys
def send(frame):
    print(json.dumps(frame), flush=True)
send({"type": "ready"})
for line in sys.stdin:
    msg = json.loads(line)
    send({"type": "status", "message": "thinking"})
    send({"type": "tool.start", "id": "t1", "name": "upper", "input": msg["content"]})
    send({"type": "tool.end", "id": "t1", "output": msg["content"].upper()})
    send({"type": "text", "content": "jsonl: " + msg["content"] + " turn " + str(msg["turn"])})
    send({"type": "turn.done"})
`

const drivers = await probeDrivers()
let t: TestRuntime

beforeAll(async () => {
  t = await openTestRuntime()
  await makeRevision(t.runtime, 'rev_conf', { 'agent.py': AGENT, 'jsonl.py': JSONL_AGENT })
})

afterAll(async () => {
  await t?.close()
})

describe.each(DRIVERS)('%s driver: agents', (isolation) => {
  const test = it.skipIf(!drivers[isolation].ok)

  test('keeps state across warm turns and across sandboxes on the same workspace', async () => {
    const { agent, workspaceDir } = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'agent.py'])
    try {
      expect(agent.isolation).toBe(isolation)
      expect(await reply(agent, 'write kept across sandboxes', 1)).toBe('wrote\n')
      expect(await reply(agent, 'count', 2)).toBe('2\n') // the same process: memory survives the turn
      expect(await reply(agent, 'read', 3)).toBe('kept across sandboxes\n')
    } finally {
      await t.runtime.stopAgent(agent)
    }
    const again = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'agent.py'], { workspaceDir })
    try {
      expect(await reply(again.agent, 'read', 1)).toBe('kept across sandboxes\n')
      expect(await reply(again.agent, 'count', 2)).toBe('2\n') // a fresh process
    } finally {
      await t.runtime.stopAgent(again.agent)
    }
    expect(readFileSync(path.join(workspaceDir, 'notes.txt'), 'utf8')).toBe('kept across sandboxes\n')
  })

  test('speaks jsonl: frames in, events and text out', async () => {
    const { agent } = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'jsonl.py'], {
      protocol: 'jsonl',
    })
    try {
      const first = await turn(agent, 'hello', 1)
      expect(first.outcome).toMatchObject({ status: 'completed', text: 'jsonl: hello turn 1' })
      expect(first.events.map((e: AgentEvent) => e.type)).toEqual([
        'status',
        'tool.start',
        'tool.end',
        'text',
      ])
      expect(first.events[2]).toMatchObject({ type: 'tool.end', output: 'HELLO' })
      expect((await turn(agent, 'again', 2)).outcome).toMatchObject({ text: 'jsonl: again turn 2' })
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  test('speaks exec: one sandbox per turn, the message on stdin', async () => {
    const { agent, workspaceDir } = await startOn(
      t.runtime,
      isolation,
      'rev_conf',
      ['bash', '-c', 'read -r msg; echo "exec got: $msg (turn $CAIRN_TURN)"; echo "$msg" >> exec.log'],
      { protocol: 'exec' },
    )
    try {
      expect(await reply(agent, 'one', 1)).toBe('exec got: one (turn 1)\n')
      expect(await reply(agent, 'two', 2)).toBe('exec got: two (turn 2)\n')
    } finally {
      await t.runtime.stopAgent(agent)
    }
    expect(readFileSync(path.join(workspaceDir, 'exec.log'), 'utf8')).toBe('one\ntwo\n')
  })

  test('reports a crash with its output and stderr, and the workspace stays usable', async () => {
    const { agent, workspaceDir } = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'agent.py'])
    try {
      expect(await reply(agent, 'write before the crash', 1)).toBe('wrote\n')
      const { outcome } = await turn(agent, 'crash', 2)
      expect(outcome).toMatchObject({
        status: 'failed',
        code: 'agent_crashed',
        cause: 'agent_crash',
        text: 'partial output\n',
      })
      if (outcome.status === 'failed') {
        expect(outcome.message).toMatch(/exited with code 1/)
        expect(outcome.message).toContain('RuntimeError: boom from the agent')
      }
      expect(agent.alive).toBe(false)
    } finally {
      await t.runtime.stopAgent(agent)
    }
    const again = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'agent.py'], { workspaceDir })
    try {
      expect(await reply(again.agent, 'read', 1)).toBe('before the crash\n')
    } finally {
      await t.runtime.stopAgent(again.agent)
    }
  })

  test('stops an agent that allocates past memoryMiB with memory_limit', async () => {
    const { agent, workspaceDir } = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'agent.py'], {
      memoryMiB: 64,
    })
    try {
      // Within the limit: fine.
      expect(await reply(agent, 'alloc 16', 1)).toBe('allocating\nallocated 16\n')
      const { outcome } = await turn(agent, 'alloc 1000', 2)
      expect(outcome).toMatchObject({ status: 'failed', code: 'limit_exceeded', cause: 'memory_limit' })
      expect(outcome.text).toBe('allocating\n')
    } finally {
      await t.runtime.stopAgent(agent)
    }
    expect(liveSandboxCgroups(t.runtime)).toEqual([])
    const again = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'agent.py'], { workspaceDir })
    try {
      expect(await reply(again.agent, 'alloc 8', 1)).toBe('allocating\nallocated 8\n')
    } finally {
      await t.runtime.stopAgent(again.agent)
    }
  })

  test('stops an agent that forks past its pids limit with pids_limit', async () => {
    const { agent } = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'agent.py'], { pids: 16 })
    try {
      const { outcome } = await turn(agent, 'fork 2000', 1)
      expect(outcome).toMatchObject({ status: 'failed', code: 'limit_exceeded', cause: 'pids_limit' })
    } finally {
      await t.runtime.stopAgent(agent)
    }
    expect(liveSandboxCgroups(t.runtime)).toEqual([])
    expect(instanceProcesses(t.runtime)).toEqual([])
  })

  test('applies the cpu limit: a busy agent at cpus 0.2 is throttled', async () => {
    const { agent } = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'agent.py'], {
      cpus: 0.2,
      memoryMiB: 96,
      pids: 24,
    })
    try {
      expect(await reply(agent, 'spin 0.6', 1)).toBe('spun\n')
      const dirs = limitCgroupDirs(t.runtime, sandboxCgroupName(t.runtime, agent.pid))
      const cpuDir = dirs.cpu ?? dirs.unified
      expect(cpuDir).toBeDefined()
      const stat = readFileSync(path.join(cpuDir ?? '', 'cpu.stat'), 'utf8')
      expect(Number(/^nr_throttled (\d+)$/m.exec(stat)?.[1] ?? 0)).toBeGreaterThan(0)
      if (dirs.cpu) {
        expect(readFileSync(path.join(dirs.cpu, 'cpu.cfs_quota_us'), 'utf8').trim()).toBe('20000')
      }
      // The agent's own allowance is there whatever the driver adds for its machinery.
      if (dirs.memory) {
        const bytes = Number(readFileSync(path.join(dirs.memory, 'memory.limit_in_bytes'), 'utf8'))
        expect(bytes).toBeGreaterThanOrEqual(96 << 20)
      }
      if (dirs.pids) {
        expect(Number(readFileSync(path.join(dirs.pids, 'pids.max'), 'utf8'))).toBeGreaterThanOrEqual(24)
      }
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  test('freezes a running agent so the workspace holds still, and thaws it', async () => {
    const { agent, workspaceDir } = await startOn(t.runtime, isolation, 'rev_conf', ['python3', 'agent.py'])
    const ticks = path.join(workspaceDir, 'ticks.txt')
    const size = () => {
      try {
        return statSync(ticks).size
      } catch {
        return 0
      }
    }
    const running = turn(agent, 'ticker', 1)
    try {
      expect(await waitFor(() => size() > 20, 10_000)).toBe(true)
      await agent.freeze()
      const frozenAt = size()
      await new Promise((r) => setTimeout(r, 300))
      expect(size()).toBe(frozenAt)
      await agent.thaw()
      expect(await waitFor(() => size() > frozenAt, 5000)).toBe(true)
    } finally {
      await t.runtime.stopAgent(agent)
      await running
    }
  })

  test('refuses what it declares it cannot do with a typed error', async () => {
    const driver = t.runtime.drivers[isolation]
    const lacking = (Object.keys(driver.capabilities) as (keyof typeof driver.capabilities)[]).filter(
      (c) => !driver.capabilities[c],
    )
    // Declared, not guessed: every capability is a plain boolean.
    expect(Object.values(driver.capabilities).every((v) => typeof v === 'boolean')).toBe(true)
    // A driver without `freeze` must refuse a snapshot's freeze rather than race the agent: the
    // same driver with the capability withdrawn shows the refusal through AgentProcess.
    const withoutFreeze: SandboxDriver = Object.create(driver, {
      capabilities: { value: { ...driver.capabilities, freeze: false } },
    })
    const agent = new AgentProcess(
      withoutFreeze,
      {
        sessionId: 'ses_capcheck',
        workspaceDir: '/nonexistent',
        command: ['true'],
        protocol: 'exec',
        env: {},
        limits: { memoryMiB: 64, pids: 16, cpus: 1 },
        turnTimeoutMs: 1000,
      },
      path.join(t.runtime.runDir, 'sandboxes'),
    )
    const refusal = await agent.freeze().catch((e: unknown) => e)
    expect(refusal).toBeInstanceOf(CairnProblem)
    expect(refusal).toMatchObject({
      code: 'bad_request',
      details: { driver: isolation, capability: 'freeze' },
    })
    for (const capability of lacking)
      expect(['network', 'memorySnapshot', 'ports', 'transparentEgress']).toContain(capability)
  })
})
