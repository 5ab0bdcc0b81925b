import { readFileSync, statSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { Runtime } from '../../packages/runtime/src/runtime.js'
import type { GvisorDriver } from '../../packages/runtime/src/sandbox/gvisor-driver.js'
import {
  gvisorLeftovers,
  instanceProcesses,
  liveSandboxCgroups,
  makeRevision,
  probeDrivers,
  reply,
  SANDBOX_UID,
  startOn,
  turn,
  waitFor,
} from './harness.js'

const AGENT = `import os
print("pool agent starting")
while True:
    line = input()
    if line == "who":
        with open("pooled.txt", "w") as f:
            f.write("written from a pool slot\\n")
        print(os.getuid(), os.getcwd(), sorted(os.listdir(".")), os.environ.get("MULTI"))
    elif line.startswith("alloc "):
        print("allocating", flush=True)
        blocks = [b"\\x01" * (1 << 20) for _ in range(int(line[6:]))]
        print("allocated", len(blocks))
    elif line == "crash":
        raise SystemExit(3)
    else:
        print("echo:", line)
`

const drivers = await probeDrivers()
let dataDir: string
let runtime: Runtime
let gvisor: GvisorDriver

/** Host mounts of pool slots (the slots directory's own shared mount aside). */
function slotMounts(): string[] {
  const slots = path.join(runtime.runDir, 'gvisor', 'slots')
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((p) => p.startsWith(`${slots}/`))
}

async function ready(): Promise<void> {
  expect(await waitFor(() => gvisor.pooled >= 1, 15_000)).toBe(true)
}

describe.skipIf(!drivers.gvisor.ok)('gvisor pool', () => {
  beforeAll(async () => {
    dataDir = await mkdtemp(path.join(tmpdir(), 'cairn-conf-pool-'))
    runtime = new Runtime({ dataDir, poolImageSizeBytes: 512 * 1024 * 1024, gvisor: { poolSize: 1 } })
    await runtime.open()
    gvisor = runtime.drivers.gvisor as GvisorDriver
    await makeRevision(runtime, 'rev_pool', { 'agent.py': AGENT })
  })

  afterAll(async () => {
    const runDir = runtime?.runDir
    await runtime?.close()
    if (runDir) expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(`${runDir}/gvisor`)
    await rm(dataDir, { recursive: true, force: true })
  })

  it('serves an agent from a pre-started sandbox, same as a cold one', async () => {
    await ready()
    const { agent, workspaceDir } = await startOn(runtime, 'gvisor', 'rev_pool', ['python3', 'agent.py'], {
      env: { MULTI: "two\nlines 'quoted'" },
    })
    expect(gvisor.pooled).toBe(0) // claimed
    try {
      expect(await reply(agent, 'who', 1)).toBe(
        `1000 /workspace ['agent.py', 'pooled.txt'] two\nlines 'quoted'\n`,
      )
      expect(statSync(path.join(workspaceDir, 'pooled.txt')).uid).toBe(SANDBOX_UID)
      expect(slotMounts().length).toBe(2) // the workspace and the run dir, bound into the slot
      await agent.freeze()
      await agent.thaw()
      expect(await reply(agent, 'after thaw', 2)).toBe('echo: after thaw\n')
    } finally {
      await runtime.stopAgent(agent)
    }
    expect(slotMounts()).toEqual([])
  })

  it('reports exit codes, limits and fast exits of pooled sandboxes', async () => {
    await ready()
    const crash = await startOn(runtime, 'gvisor', 'rev_pool', ['python3', 'agent.py'])
    try {
      const { outcome } = await turn(crash.agent, 'crash', 1)
      expect(outcome).toMatchObject({ status: 'failed', code: 'agent_crashed' })
      if (outcome.status === 'failed') expect(outcome.message).toMatch(/exited with code 3/)
    } finally {
      await runtime.stopAgent(crash.agent)
    }
    await ready()
    const hog = await startOn(runtime, 'gvisor', 'rev_pool', ['python3', 'agent.py'], { memoryMiB: 64 })
    try {
      expect((await turn(hog.agent, 'alloc 1000', 1)).outcome).toMatchObject({ cause: 'memory_limit' })
    } finally {
      await runtime.stopAgent(hog.agent)
    }
    await ready()
    // An agent that is gone before anyone could ask runsc for its status.
    const quick = await startOn(
      runtime,
      'gvisor',
      'rev_pool',
      ['sh', '-c', 'read m; echo "got $m"; exit 0'],
      {
        protocol: 'exec',
      },
    )
    try {
      expect(await reply(quick.agent, 'fast', 1)).toBe('got fast\n')
    } finally {
      await runtime.stopAgent(quick.agent)
    }
    expect(liveSandboxCgroups(runtime).filter((dir) => !path.basename(dir).startsWith('gvpool_'))).toEqual([])
    expect(slotMounts()).toEqual([])
  })

  it('leaves nothing behind once the runtime closes', async () => {
    await ready()
    await runtime.close()
    expect(liveSandboxCgroups(runtime)).toEqual([])
    expect(await waitFor(() => instanceProcesses(runtime, { zombies: true }).length === 0, 10_000)).toBe(true)
    expect(gvisorLeftovers(runtime)).toEqual([])
    // Reopened for afterAll, which closes it again.
    await runtime.open()
  })
})
