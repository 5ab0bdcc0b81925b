import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, readFileSync, statSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { IsolationName } from '../../packages/runtime/src/sandbox/driver.js'
import { DRIVERS, limitCgroupDirs, probeDrivers, sandboxCgroupName } from '../conformance/harness.js'
import { askProbe, CONTAINED, parseProbeResults, probeProjectFiles } from '../helpers/probe.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

const QUOTA_MIB = 16
const drivers = await probeDrivers()
let t: TestServer

beforeAll(async () => {
  t = await startTestServer({ server: { workspaceQuotaMiB: QUOTA_MIB } })
  for (const isolation of DRIVERS.filter((d) => drivers[d].ok)) {
    const project = await makeProject(probeProjectFiles(`probe-${isolation}`, isolation, true))
    expect((await t.api.deploy(project)).status).toBe(201)
  }
})

afterAll(async () => {
  await t?.close()
})

/** Sends one message; the turn must complete (the attempt failed and the agent said how). */
const ask = (sessionId: string, message: string) => askProbe(t.api, sessionId, message)

/** Host processes of a session's warm sandbox (its cgroup), and the sandbox id. */
function sandboxOf(sessionId: string): { sandboxId: string; cgroupName: string; pids: number[] } {
  const agent = t.server.runtime.agentOf(sessionId)
  if (!agent) throw new Error(`session ${sessionId} has no warm sandbox`)
  const cgroupName = sandboxCgroupName(t.server.runtime, agent.pid)
  const dirs = limitCgroupDirs(t.server.runtime, cgroupName)
  const dir = dirs.memory ?? dirs.unified
  if (!dir) throw new Error(`sandbox ${agent.sandboxId} has no cgroup`)
  const pids = readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number)
  return { sandboxId: agent.sandboxId, cgroupName, pids }
}

function oomScores(pids: number[]): Record<number, string> {
  const scores: Record<number, string> = {}
  for (const pid of pids) {
    try {
      scores[pid] = readFileSync(`/proc/${pid}/oom_score_adj`, 'utf8').trim()
    } catch {
      // exited meanwhile
    }
  }
  return scores
}

/** Processes each driver's sandbox shows: its own init (bwrap's) and the agent, nothing else. */
const OWN_PROCESSES: Record<IsolationName, unknown> = {
  bwrap: [
    { pid: 1, cmd: 'bwrap', session: '-' },
    { pid: 2, cmd: 'python3', session: 'mine' },
  ],
  gvisor: [{ pid: 1, cmd: 'python3', session: 'mine' }],
}

describe.each(DRIVERS)('%s driver: escape attempts from inside the sandbox are contained', (isolation) => {
  const test = it.skipIf(!drivers[isolation].ok)
  const agent = `probe-${isolation}`
  const newSession = async () => (await t.api.createSession(agent, { autoSnapshots: false })).id
  let probe = ''
  let other = ''
  const marker = `marker-${randomBytes(6).toString('hex')}`

  beforeAll(async () => {
    if (!drivers[isolation].ok) return
    probe = await newSession()
    other = await newSession()
    expect(await ask(other, `write ${marker} the other session's secret`)).toBe(`wrote ${marker}`)
  })

  test('refuses host-managing syscalls, host files, kernel knobs and privileges', async () => {
    expect(await ask(probe, 'caps')).toBe('0000000000000000')
    const before = oomScores(sandboxOf(probe).pids)
    expect(parseProbeResults(await ask(probe, 'all'))).toEqual(CONTAINED[isolation])
    // What the agent wrote to oom_score_adj (refused by bwrap, kept inside gVisor's kernel) did
    // not reach the host: the sandbox's host processes keep their scores.
    const after = oomScores(sandboxOf(probe).pids)
    const kept = Object.keys(before).filter((pid) => pid in after)
    expect(kept.length).toBeGreaterThan(0)
    for (const pid of kept) expect(after[Number(pid)], `host pid ${pid}`).toBe(before[Number(pid)])
  })

  test("cannot reach another session's workspace: not by its host path, nor through /proc/*/root", async () => {
    const { runtime } = t.server
    const otherHostPath = runtime.pool.workspacePath(other)
    expect(existsSync(path.join(otherHostPath, marker))).toBe(true)
    const places = [otherHostPath, runtime.pool.root, runtime.runDir, t.dataDir]
    expect(await ask(probe, `search ${marker} ${places.join(' ')}`)).toBe('not found')
    // The same search finds the probe's own file, through its own processes' roots too.
    const own = `own-${marker}`
    expect(await ask(probe, `write ${own} mine`)).toBe(`wrote ${own}`)
    const found = (await ask(probe, `search ${own}`)).split(' ')
    expect(found).toContain(`/workspace/${own}`)
    expect(found).toContainEqual(expect.stringMatching(new RegExp(`^/proc/\\d+/root/workspace/${own}$`)))
  })

  test('sees only its own processes, and can neither ptrace nor signal the runtime or another session', async () => {
    expect(JSON.parse(await ask(probe, 'procs'))).toEqual(OWN_PROCESSES[isolation])
    const { pids: otherPids } = sandboxOf(other)
    for (const pid of [process.pid, ...otherPids]) {
      expect(await ask(probe, `ptrace ${pid}`), `ptrace ${pid}`).toBe('Operation not permitted')
      expect(await ask(probe, `kill ${pid}`), `kill ${pid}`).toBe('No such process')
    }
  })

  test('gains nothing from setuid binaries (no new privileges)', async () => {
    // su is setuid root on the host; running it inside leaves the effective uid the agent's.
    expect(statSync('/usr/bin/su').mode & 0o4000).toBe(0o4000)
    expect(await ask(probe, 'setuid')).toBe('euid=1000 caps=0000000000000000')
  })

  test('fills its workspace only up to its quota: EDQUOT inside, other sessions and the host unaffected', async () => {
    const image = path.join(t.dataDir, 'pool.img')
    const allocated = () => statSync(image).blocks * 512
    const before = allocated()
    expect(await ask(probe, 'fill')).toBe(`EDQUOT after ${QUOTA_MIB - 1} MiB`)
    const filled = statSync(path.join(t.server.runtime.pool.workspacePath(probe), 'fill.bin')).size
    expect(filled).toBeLessThanOrEqual(QUOTA_MIB * 1024 * 1024)
    // The host disk holds the pool image: it grew by about what the quota let through, no more.
    expect(allocated() - before).toBeLessThan(QUOTA_MIB * 1.5 * 1024 * 1024)
    expect(await ask(other, 'blob four.bin 4')).toBe('wrote 4 MiB')
    expect(await ask(probe, 'rm /workspace/fill.bin')).toBe('removed /workspace/fill.bin')
    expect(await ask(probe, 'blob again.bin 1')).toBe('wrote 1 MiB')
  })

  test('a memory bomb is stopped with memory_limit; the session stays resumable', async () => {
    const session = await newSession()
    expect(await ask(session, 'write keep.txt kept')).toBe('wrote keep.txt')
    const { cgroupName } = sandboxOf(session)
    const run = await t.api.send(session, 'membomb')
    expect(run.terminal).toMatchObject({ type: 'run.failed', error: { code: 'limit_exceeded' } })
    const info = await t.api.call('GET', `/v1/sessions/${session}`)
    expect(info.body).toMatchObject({ status: 'failed', statusCause: 'memory_limit', warm: false })
    expect(limitCgroupDirs(t.server.runtime, cgroupName)).toEqual({})
    expect(await ask(session, 'cat keep.txt')).toBe('kept')
  })

  test('a fork bomb is stopped with pids_limit; the session stays resumable, the host can still fork', async () => {
    const session = await newSession()
    expect(await ask(session, 'write keep.txt kept')).toBe('wrote keep.txt')
    const { cgroupName } = sandboxOf(session)
    const run = await t.api.send(session, 'forkbomb')
    expect(run.terminal).toMatchObject({ type: 'run.failed', error: { code: 'limit_exceeded' } })
    const info = await t.api.call('GET', `/v1/sessions/${session}`)
    expect(info.body).toMatchObject({ status: 'failed', statusCause: 'pids_limit', warm: false })
    expect(limitCgroupDirs(t.server.runtime, cgroupName)).toEqual({})
    expect(execFileSync('echo', ['host fine'], { encoding: 'utf8' })).toBe('host fine\n')
    expect(await ask(session, 'cat keep.txt')).toBe('kept')
    expect(await ask(other, `cat ${marker}`)).toBe("the other session's secret")
  })
})
