import { readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import { chmod, mkdtemp, rm } from 'node:fs/promises'
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
    elif line == "read-only":
        for p in ("/run/cairn/x", "/opt/cairn/x", "/env/x", "/x"):
            try:
                open(p, "w")
                print(p, "written")
            except OSError as e:
                print(p, "refused" if e.errno in (13, 30) else e.errno)
    elif line == "host":
        print(open("host.txt").read())
    elif line == "crash":
        raise SystemExit(3)
    else:
        print("echo:", line)
`

const drivers = await probeDrivers()
let dataDir: string
let runtime: Runtime
let gvisor: GvisorDriver

/** Session directories bound into pool slots (not the slots' own roots, nor the staging directory). */
function slotMounts(): string[] {
  const slots = path.join(runtime.runDir, 'gvisor', 'slots')
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((p) => p.startsWith(`${slots}/`) && /\/gvpool_[0-9a-f]+\/root\/./.test(p))
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
    const claimed = gvisor.poolStats.claimed
    const { agent, workspaceDir } = await startOn(runtime, 'gvisor', 'rev_pool', ['python3', 'agent.py'], {
      env: { MULTI: "two\nlines 'quoted'" },
      memoryMiB: 1024, // above the waiting slot's limit: the claim raises it
    })
    expect(gvisor.pooled).toBe(0)
    expect(gvisor.poolStats).toMatchObject({ claimed: claimed + 1, failed: 0 })
    try {
      expect(await reply(agent, 'who', 1)).toBe(
        `1000 /workspace ['agent.py', 'pooled.txt'] two\nlines 'quoted'\n`,
      )
      expect(statSync(path.join(workspaceDir, 'pooled.txt')).uid).toBe(SANDBOX_UID)
      expect(slotMounts().length).toBe(2) // the workspace and the run dir, bound into the slot
      // Bound read-only on the host, and the copy gVisor's gofer sees is read-only too.
      expect(await reply(agent, 'read-only', 2)).toBe(
        '/run/cairn/x refused\n/opt/cairn/x refused\n/env/x 2\n/x refused\n',
      )
      // What the host writes into the workspace between turns, the warm agent reads.
      writeFileSync(path.join(workspaceDir, 'host.txt'), 'from the host')
      expect(await reply(agent, 'host', 3)).toBe('from the host\n')
      await agent.freeze()
      await agent.thaw()
      expect(await reply(agent, 'after thaw', 4)).toBe('echo: after thaw\n')
    } finally {
      await runtime.stopAgent(agent)
    }
    expect(slotMounts()).toEqual([])
  })

  it('binds extra directories read-only into a slot of their layout', async () => {
    const envDir = await mkdtemp(path.join(dataDir, 'env-'))
    writeFileSync(path.join(envDir, 'lib.txt'), 'library')
    await chmod(envDir, 0o777) // only the mount may refuse the agent's write
    const binds = [{ source: envDir, dest: '/env', readOnly: true }]
    // The first start of a layout boots cold and has the pool keep slots of it from then on.
    const first = await startOn(runtime, 'gvisor', 'rev_pool', ['python3', 'agent.py'], { binds })
    await runtime.stopAgent(first.agent)
    expect(await waitFor(() => gvisor.pooled >= 2, 15_000)).toBe(true)
    const claimed = gvisor.poolStats.claimed
    const { agent } = await startOn(runtime, 'gvisor', 'rev_pool', ['python3', 'agent.py'], { binds })
    try {
      expect(gvisor.poolStats).toMatchObject({ claimed: claimed + 1, failed: 0 })
      expect(slotMounts().length).toBe(3)
      expect(await reply(agent, 'read-only', 1)).toBe(
        '/run/cairn/x refused\n/opt/cairn/x refused\n/env/x refused\n/x refused\n',
      )
      expect(readdirSync(envDir)).toEqual(['lib.txt'])
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
