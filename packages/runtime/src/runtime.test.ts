import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  instanceProcesses,
  liveSandboxCgroups,
  loopDevicesFor,
  makeRevision,
  POOL_BYTES,
  poolMounts,
  reply,
  startAgent,
  waitFor,
} from '../test/harness.js'
import { Runtime } from './runtime.js'

let dataDir: string
const opened: Runtime[] = []

function newRuntime(): Runtime {
  const runtime = new Runtime({ dataDir, poolImageSizeBytes: POOL_BYTES })
  opened.push(runtime)
  return runtime
}

beforeAll(async () => {
  dataDir = await mkdtemp(path.join(tmpdir(), 'cairn-rt-life-'))
})

afterAll(async () => {
  // Whatever a failed test left: the last runtime unmounts the pool, however it was opened.
  // (A runtime closed by its test fails to close twice: nothing is left of it.)
  for (const runtime of opened.reverse()) await runtime.close().catch(() => undefined)
  await rm(dataDir, { recursive: true, force: true })
})

function cgroupScopeDirs(runtime: Runtime): string[] {
  const instance = path.basename(runtime.runDir)
  return ['unified', 'memory', 'pids', 'cpu', 'freezer']
    .map((h) => path.join('/sys/fs/cgroup', h, 'cairn', instance))
    .filter((dir) => existsSync(dir))
}

describe('Runtime lifecycle', () => {
  it('opens a loop-backed pool and closes it without leaving a mount, a loop device or cgroups', async () => {
    const runtime = newRuntime()
    expect(await runtime.open()).toEqual({ orphansReaped: 0 })
    expect(poolMounts(runtime)).toBe(1)
    expect(loopDevicesFor(dataDir)).toHaveLength(1)
    expect(readFileSync(path.join(runtime.runDir, 'etc', 'passwd'), 'utf8')).toContain('agent:x:1000:1000')
    expect(existsSync(path.join(runtime.runDir, 'kit', 'shims', 'python', 'sitecustomize.py'))).toBe(true)
    expect(existsSync(path.join(runtime.runDir, 'kit', 'src'))).toBe(false)

    await makeRevision(runtime, 'rev_life', { 'agent.py': 'while True:\n    print("re:", input())\n' })
    // An agent left warm is stopped by close.
    const { agent } = await startAgent(runtime, 'rev_life', ['python3', 'agent.py'])
    expect(await reply(agent, 'hi', 1)).toBe('re: hi\n')
    expect(runtime.warmCount).toBe(1)
    expect(instanceProcesses(runtime).length).toBeGreaterThan(0)

    await runtime.close()
    expect(agent.alive).toBe(false)
    expect(runtime.warmCount).toBe(0)
    // Killed by the runtime: not even a zombie is left for the host's PID 1 to reap.
    expect(instanceProcesses(runtime, { zombies: true })).toEqual([])
    expect(poolMounts(runtime)).toBe(0)
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(runtime.pool.root)
    expect(await waitFor(() => loopDevicesFor(dataDir).length === 0)).toBe(true)
    expect(cgroupScopeDirs(runtime)).toEqual([])
    expect(existsSync(runtime.runDir)).toBe(false)
    // The pool image, and so every workspace, stays in the data dir.
    expect(existsSync(path.join(dataDir, 'pool.img'))).toBe(true)
  })

  it('reopens the same pool with its revisions and workspaces after a clean close', async () => {
    const runtime = newRuntime()
    await runtime.open()
    try {
      expect(await runtime.pool.hasRevision('rev_life')).toBe(true)
      expect(poolMounts(runtime)).toBe(1)
    } finally {
      await runtime.close()
    }
    expect(poolMounts(runtime)).toBe(0)
  })

  it('after a crash, reaps the orphaned sandbox and reuses the pool mount', async () => {
    const crashed = newRuntime()
    await crashed.open()
    const { agent, workspaceDir } = await startAgent(crashed, 'rev_life', ['python3', 'agent.py'])
    expect(await reply(agent, 'before the crash', 1)).toBe('re: before the crash\n')
    const orphanPids = instanceProcesses(crashed)
    expect(orphanPids.length).toBeGreaterThan(0)
    expect(liveSandboxCgroups(crashed).length).toBeGreaterThan(0)
    // `crashed` is never closed: a new process of the same instance takes over.

    const runtime = newRuntime()
    expect(runtime.runDir).toBe(crashed.runDir)
    expect(await runtime.open()).toEqual({ orphansReaped: 1 })
    expect(liveSandboxCgroups(runtime)).toEqual([])
    expect(instanceProcesses(runtime, { zombies: true })).toEqual([])
    for (const pid of orphanPids) expect(existsSync(`/proc/${pid}`), `pid ${pid}`).toBe(false)
    expect(await waitFor(() => !agent.alive)).toBe(true)
    // Not remounted: one mount, one loop device.
    expect(poolMounts(runtime)).toBe(1)
    expect(loopDevicesFor(dataDir)).toHaveLength(1)

    // The workspace survived and a fresh sandbox runs on it.
    const again = await startAgent(runtime, 'rev_life', ['python3', 'agent.py'], { workspaceDir })
    expect(await reply(again.agent, 'after the crash', 1)).toBe('re: after the crash\n')

    await runtime.close()
    expect(poolMounts(runtime)).toBe(0)
    expect(await waitFor(() => loopDevicesFor(dataDir).length === 0)).toBe(true)
    expect(cgroupScopeDirs(runtime)).toEqual([])
  })

  it('starts a sandbox from a spare launcher with its own limits, and closes without leaving any', async () => {
    const runtime = new Runtime({ dataDir, poolImageSizeBytes: POOL_BYTES, spareLaunchers: 1 })
    opened.push(runtime)
    await runtime.open()
    // `fds` lists the agent shell's descriptors with builtins only (a pipeline would show its pipe).
    await makeRevision(runtime, 'rev_spare', {
      'agent.sh':
        'while IFS= read -r line; do if [ "$line" = fds ]; then for f in /proc/$$/fd/*; do printf "%s " "${f##*/}"; done; echo; else echo "re: $line"; fi; done\n',
    })
    const first = await startAgent(runtime, 'rev_spare', ['bash', 'agent.sh'])
    expect(await reply(first.agent, 'one', 1)).toBe('re: one\n')
    // The first start asked for a spare: a launcher waits in a cgroup of its own.
    const unified = cgroupScopeDirs(runtime)[0] as string
    const spareReady = () =>
      readdirSync(unified, { withFileTypes: true }).some(
        (entry) =>
          entry.isDirectory() &&
          entry.name !== first.agent.sandboxId &&
          readFileSync(path.join(unified, entry.name, 'cgroup.procs'), 'utf8').trim() !== '',
      )
    expect(await waitFor(spareReady, 5000)).toBe(true)

    const second = await startAgent(runtime, 'rev_spare', ['bash', 'agent.sh'], { memoryMiB: 96, pids: 40 })
    expect(await reply(second.agent, 'two', 1)).toBe('re: two\n')
    // The pooled launcher's command pipe (fd 4) is not inherited: the same descriptors as a
    // sandbox started from scratch.
    const fds = await reply(second.agent, 'fds', 2)
    expect(fds).toMatch(/^0 1 2 /)
    expect(fds).toBe(await reply(first.agent, 'fds', 2))
    // Its cgroup is the spare's (not named after the sandbox), with this agent's limits: v1
    // `memory` and `pids` hierarchies where the host has them, else the v2 one.
    const cgroups = readFileSync(`/proc/${second.agent.pid}/cgroup`, 'utf8')
    const cgroupOf = (hierarchy: string) => new RegExp(`^\\d+:${hierarchy}:(.*)$`, 'm').exec(cgroups)?.[1]
    const v1Memory = cgroupOf('memory')
    const limitFiles = v1Memory
      ? {
          memory: `/sys/fs/cgroup/memory${v1Memory}/memory.limit_in_bytes`,
          pids: `/sys/fs/cgroup/pids${cgroupOf('pids')}/pids.max`,
        }
      : { memory: `/sys/fs/cgroup${cgroupOf('')}/memory.max`, pids: `/sys/fs/cgroup${cgroupOf('')}/pids.max` }
    expect(path.basename(path.dirname(limitFiles.memory))).not.toBe(second.agent.sandboxId)
    expect(readFileSync(limitFiles.memory, 'utf8').trim()).toBe(String(96 * 1024 * 1024))
    expect(readFileSync(limitFiles.pids, 'utf8').trim()).toBe('40')

    await runtime.close()
    expect(cgroupScopeDirs(runtime)).toEqual([])
    expect(instanceProcesses(runtime)).toEqual([])
  })
})
