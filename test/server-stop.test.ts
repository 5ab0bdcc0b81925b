import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import net from 'node:net'
import path from 'node:path'
import { instanceRunDir } from '@cairn/runtime'
import { afterAll, describe, expect, it } from 'vitest'
import { testDatabaseFor } from './fixtures/test-database.mjs'
import { assertBuilt, CLI_BIN, spawnCli, waitFor } from './helpers/cli.js'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { releasePoolImage, scratchDir } from './helpers/scratch.js'
import { Api, EXAMPLES } from './helpers/server.js'

// `cairn server` stopped as a terminal and systemd stop it: a signal to its whole process group
// (Ctrl-C; `kill -- -PGID`; KillMode=control-group), with its output piped to a process that the
// same signal kills (`cairn server | tee log`). It must stop as cleanly as when only its own pid is
// signalled: the process gone, nothing mounted under its run dir, no loop device on its pool image.

/** Correctness bounds (a stop that hangs or leaves state behind fails them), not speed claims. */
const STOP_BOUND_MS = 30_000
const PORT_TAKEN_BOUND_MS = 10_000

const groups: ChildProcess[] = []
const dataDirs: string[] = []

afterAll(() => {
  for (const group of groups) {
    if (group.pid !== undefined && group.exitCode === null) {
      try {
        process.kill(-group.pid, 'SIGKILL')
      } catch {}
    }
  }
  // What a server that failed these tests left (a graceful stop leaves nothing).
  for (const dir of dataDirs) {
    const runDir = instanceRunDir(dir)
    for (const point of mountsUnder(runDir).reverse()) spawnSync('umount', ['-l', point])
    releasePoolImage(path.join(dir, 'pool.img'))
    rmSync(runDir, { recursive: true, force: true })
  }
})

/** What is mounted at or below `dir`. */
function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((point) => point === dir || point.startsWith(`${dir}/`))
}

function loopDevicesOf(image: string): string {
  return execFileSync('losetup', ['-j', image], { encoding: 'utf8' }).trim()
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

interface Group {
  leader: ChildProcess
  dataDir: string
  serverPid: number
  api: Api
  /** The server's exit code, as the shell saw it once the pipeline ended. */
  exitCode: () => Promise<number>
}

/**
 * `cairn server … | tee log` in a process group of its own (as a terminal runs it), with two
 * sessions whose sandboxes are warm.
 */
async function startGroup(): Promise<Group> {
  assertBuilt()
  const dataDir = await scratchDir('cairn-stop-')
  dataDirs.push(dataDir)
  const database = await testDatabaseFor(dataDir)
  const log = path.join(dataDir, 'server.log')
  const codeFile = path.join(dataDir, 'server.code')
  const args = [CLI_BIN, 'server', '--data-dir', dataDir, '--port', '0', '--json']
  if (database) args.push('--database', database)
  // The shell's trap is a handler, not an ignore, so the server and tee get the signal as usual;
  // the shell itself lives on to record the server's exit code.
  const script = `trap : INT TERM; "${process.execPath}" ${args.map((a) => `'${a}'`).join(' ')} 2>&1 | tee '${log}' >/dev/null; echo \${PIPESTATUS[0]} > '${codeFile}'`
  const leader = spawn('bash', ['-c', script], {
    detached: true,
    stdio: 'ignore',
    env: { ...process.env, HOME: dataDir, NO_COLOR: '1' },
  })
  groups.push(leader)
  let record: { url: string } | undefined
  await waitFor(
    () => {
      const line = existsSync(log) ? readFileSync(log, 'utf8').split('\n')[0] : ''
      if (line?.startsWith('{')) record = JSON.parse(line) as { url: string }
      return record !== undefined
    },
    60_000,
    'the server to listen',
  )
  const key = (await readFile(path.join(dataDir, 'admin.key'), 'utf8')).trim()
  const api = new Api((record as { url: string }).url, key)
  expect((await api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
  for (const prompt of ['one', 'two']) {
    const session = await api.createSession('echo')
    expect((await api.send(session.id, prompt)).text).toBe(`${prompt}\n`)
  }
  const serverPid = Number((await readFile(path.join(dataDir, 'cairn.lock'), 'utf8')).trim())
  const exitCode = async () => {
    await waitFor(() => existsSync(codeFile) && readFileSync(codeFile, 'utf8').trim() !== '', 10_000)
    return Number(readFileSync(codeFile, 'utf8').trim())
  }
  return { leader, dataDir, serverPid, api, exitCode }
}

describe('a signal to the process group of cairn server', () => {
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    it(`${signal}: the server exits 0, its piped output gone, leaving nothing mounted and no loop device`, async () => {
      const group = await startGroup()
      const runDir = instanceRunDir(group.dataDir)
      expect(
        mountsUnder(runDir).length,
        'the pool (sandboxes mount in their own namespaces)',
      ).toBeGreaterThan(0)
      expect(loopDevicesOf(path.join(group.dataDir, 'pool.img'))).not.toBe('')

      process.kill(-(group.leader.pid as number), signal)
      await waitFor(() => !alive(group.serverPid), STOP_BOUND_MS, 'the server to exit')
      expect(await group.exitCode()).toBe(0)
      expect(mountsUnder(runDir)).toEqual([])
      expect(loopDevicesOf(path.join(group.dataDir, 'pool.img'))).toBe('')
      expect(existsSync(runDir)).toBe(false)
    })
  }
})

describe('a second Ctrl-C while cairn server drains its turns', () => {
  it('cancels the running turn at once and still stops cleanly', async () => {
    const group = await startGroup()
    const runDir = instanceRunDir(group.dataDir)
    expect((await group.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
    const session = await group.api.createSession('shell')
    // Longer than the shutdown grace (10 s) and than STOP_BOUND_MS: only a cancel ends it in time.
    const turn = group.api.send(session.id, 'sleep 60; echo finished')
    for (let tries = 0; ; tries++) {
      const info = await group.api.call('GET', `/v1/sessions/${session.id}`)
      if (info.body.status === 'active') break
      expect(tries, 'the turn starts').toBeLessThan(100)
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    process.kill(-(group.leader.pid as number), 'SIGINT')
    await new Promise((resolve) => setTimeout(resolve, 1000))
    expect(alive(group.serverPid), 'the first Ctrl-C waits for the running turn').toBe(true)
    process.kill(-(group.leader.pid as number), 'SIGINT')
    const ended = await turn
    expect(ended.text).not.toContain('finished')
    expect(ended.terminal?.type).toBe('run.cancelled')
    await waitFor(() => !alive(group.serverPid), STOP_BOUND_MS, 'the server to exit')
    expect(await group.exitCode()).toBe(0)
    expect(mountsUnder(runDir)).toEqual([])
    expect(loopDevicesOf(path.join(group.dataDir, 'pool.img'))).toBe('')
  })
})

describe('SIGTERM to every process of cairn server at once (systemd KillMode=control-group, harsher)', () => {
  it('the server exits 0 and its helpers and sandboxes, killed under it, leave nothing mounted', async () => {
    const group = await startGroup()
    const runDir = instanceRunDir(group.dataDir)
    const everyone = [group.serverPid, ...descendantsOf(group.serverPid)]
    expect(everyone.length, 'helpers and sandboxes run under the server').toBeGreaterThan(3)
    for (const pid of everyone) {
      try {
        process.kill(pid, 'SIGTERM')
      } catch {
        // A short-lived tool that ended since the list was read.
      }
    }
    await waitFor(() => !alive(group.serverPid), STOP_BOUND_MS, 'the server to exit')
    expect(await group.exitCode()).toBe(0)
    expect(mountsUnder(runDir)).toEqual([])
    expect(loopDevicesOf(path.join(group.dataDir, 'pool.img'))).toBe('')
  })
})

/** Every process below `pid` (children, theirs …), from /proc. */
function descendantsOf(pid: number): number[] {
  const parents = new Map<number, number[]>()
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    let stat = ''
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8')
    } catch {
      continue
    }
    const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
    parents.set(ppid, [...(parents.get(ppid) ?? []), Number(entry)])
  }
  const found: number[] = []
  const visit = (parent: number) => {
    for (const child of parents.get(parent) ?? []) {
      found.push(child)
      visit(child)
    }
  }
  visit(pid)
  return found
}

describe('a server whose port is taken', () => {
  it('fails at once with a clear error, before it mounts or reaps anything', async () => {
    assertBuilt()
    const holder = net.createServer()
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve))
    const port = (holder.address() as net.AddressInfo).port
    try {
      const dataDir = await scratchDir('cairn-port-taken-')
      dataDirs.push(dataDir)
      const database = await testDatabaseFor(dataDir)
      const startedAt = Date.now()
      const cli = spawnCli(
        [
          'server',
          '--data-dir',
          dataDir,
          '--port',
          String(port),
          ...(database ? ['--database', database] : []),
        ],
        { HOME: dataDir },
      )
      const result = await cli.done
      const elapsedMs = Date.now() - startedAt
      expect(result.code).not.toBe(0)
      expect(result.stderr).toContain(`port ${port} on 127.0.0.1 is in use`)
      expect(result.stderr).toContain('--port')
      // Nothing was touched: no pool image made or mounted, no run dir.
      expect(existsSync(path.join(dataDir, 'pool.img'))).toBe(false)
      expect(mountsUnder(instanceRunDir(dataDir))).toEqual([])
      expect(elapsedMs).toBeLessThan(PORT_TAKEN_BOUND_MS)
    } finally {
      holder.close()
    }
  })
})
