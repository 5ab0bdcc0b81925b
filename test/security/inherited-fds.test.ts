import { spawn } from 'node:child_process'
import { closeSync, openSync, readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs'
import { mkdir, mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { DRIVERS, probeDrivers } from '../conformance/harness.js'
import { testDatabaseFor } from '../fixtures/test-database.mjs'
import { assertBuilt, CLI_BIN, waitFor } from '../helpers/cli.js'
import { askProbe, probeProjectFiles } from '../helpers/probe.js'
import { makeProject } from '../helpers/projects.js'
import { Api } from '../helpers/server.js'

/**
 * A descriptor open (without close-on-exec) in whatever started `cairn server` reached every
 * sandbox: Node passes it to each child, and bwrap keeps what it is given. Here the server is
 * started as users start it, as a child process that inherits a directory on fd 40 (as after
 * `exec 40</some/dir` in a shell), and the agent looks for that directory's contents through
 * every descriptor it holds, on both drivers.
 */
const INHERITED_FD = 40
const drivers = await probeDrivers()
let home = ''
let secretDir = ''
let api: Api
let stop: () => Promise<void> = async () => undefined

beforeAll(async () => {
  assertBuilt()
  home = await mkdtemp(path.join(os.tmpdir(), 'cairn-fds-'))
  secretDir = path.join(home, 'host-secrets')
  await mkdir(secretDir)
  writeFileSync(path.join(secretDir, 'secret-marker.txt'), 'host only')
  const dirFd = openSync(secretDir, 'r')
  // stdio[INHERITED_FD] = the directory: the child gets it at that number, not close-on-exec.
  const stdio: ('ignore' | 'pipe' | number)[] = ['ignore', 'pipe', 'pipe']
  while (stdio.length < INHERITED_FD) stdio.push('ignore')
  stdio.push(dirFd)
  const database = await testDatabaseFor(path.join(home, 'data'))
  const child = spawn(
    process.execPath,
    [
      CLI_BIN,
      'server',
      '--json',
      '--port',
      '0',
      '--data-dir',
      path.join(home, 'data'),
      '--log-level',
      'error',
    ],
    {
      env: {
        ...process.env,
        HOME: home,
        NO_COLOR: '1',
        ...(database && { CAIRN_DATABASE_URL: database }),
      },
      stdio,
    },
  )
  closeSync(dirFd)
  let stdout = ''
  child.stdout?.setEncoding('utf8').on('data', (chunk: string) => {
    stdout += chunk
  })
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  stop = async () => {
    child.kill('SIGTERM')
    await exited
  }
  await waitFor(() => stdout.includes('\n') || child.exitCode !== null, 60_000, 'the server to start')
  const started = JSON.parse(stdout.split('\n')[0] ?? '{}') as { url: string; adminKeyPath: string }
  api = new Api(started.url, readFileSync(started.adminKeyPath, 'utf8').trim())
  // The server process really holds the directory at that number.
  expect(readFileSync(`/proc/${child.pid}/fdinfo/${INHERITED_FD}`, 'utf8')).toMatch(/^pos:/)
  for (const isolation of DRIVERS.filter((d) => drivers[d].ok)) {
    const project = await makeProject(probeProjectFiles(`fds-${isolation}`, isolation))
    expect((await api.deploy(project)).status).toBe(201)
  }
})

afterAll(async () => {
  await stop()
  if (home) await rm(home, { recursive: true, force: true })
})

/** Host processes inside a sandbox cgroup of the server that hold the inherited directory open. */
function sandboxHolders(): string[] {
  const found: string[] = []
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const holds = readdirSync(`/proc/${pid}/fd`).some(
        (fd) => readlinkSync(`/proc/${pid}/fd/${fd}`) === secretDir,
      )
      // The server's own root helpers (btrfs ioctls, mounts) hold it too; sandboxes must not.
      if (holds && readFileSync(`/proc/${pid}/cgroup`, 'utf8').includes('/cairn/')) {
        found.push(`${pid} ${readFileSync(`/proc/${pid}/comm`, 'utf8').trim()}`)
      }
    } catch {
      // gone, or not ours to read
    }
  }
  return found
}

const ask = (sessionId: string, message: string) => askProbe(api, sessionId, message)

describe.each(DRIVERS)('%s driver: descriptors inherited by the server', (isolation) => {
  it.skipIf(!drivers[isolation].ok)('do not reach the sandbox', async () => {
    const session = (await api.createSession(`fds-${isolation}`)).id
    expect(await ask(session, 'fds')).toBe('none')
    expect(await ask(session, 'search-fds secret-marker.txt')).toBe('not found')
    expect(await ask(session, 'write still.txt working')).toBe('wrote still.txt')
    // Nor the sandbox's host processes (bwrap, runsc, its gofer and sentry, pooled launchers).
    expect(sandboxHolders()).toEqual([])
  })
})
