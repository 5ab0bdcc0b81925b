import { type ChildProcess, spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdtemp, readFile, rm, symlink } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { instanceRunDir } from '@cairn/runtime'
import { afterAll, describe, expect, it } from 'vitest'
import { assertBuilt, CLI_BIN, spawnCli } from './helpers/cli.js'
import { makeProject } from './helpers/projects.js'
import { releasePoolImage, scratchDir } from './helpers/scratch.js'
import { Api, EXAMPLES, packDir, REPO_ROOT, startTestServer } from './helpers/server.js'

const FIXTURE = path.join(REPO_ROOT, 'test/fixtures/server-process.mjs')
const children: ChildProcess[] = []
const dataDirs: string[] = []
/** Run dirs of servers killed here (a graceful stop removes its own). */
const runDirs: string[] = []

interface Launched {
  child: ChildProcess
  /** Settles with the exit code (null after a signal) and everything the process wrote to stderr. */
  exited: Promise<{ code: number | null; stderr: string }>
  /** The API of the server, or undefined when it exited before listening. */
  api: Api | undefined
}

/** A server in its own process on `dir` (so it can be SIGKILLed, or refused while another runs). */
async function launch(dir: string): Promise<Launched> {
  const child = spawn(process.execPath, [FIXTURE, dir], { stdio: ['ignore', 'pipe', 'pipe'] })
  children.push(child)
  let stderr = ''
  child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
    stderr += chunk
  })
  const exited = new Promise<{ code: number | null; stderr: string }>((resolve) =>
    child.once('close', (code) => resolve({ code, stderr })),
  )
  const line = await Promise.race([
    new Promise<string>((resolve) =>
      createInterface({ input: child.stdout as NodeJS.ReadableStream }).once('line', resolve),
    ),
    exited.then(() => undefined),
  ])
  if (line === undefined) return { child, exited, api: undefined }
  const key = (await readFile(path.join(dir, 'admin.key'), 'utf8')).trim()
  return { child, exited, api: new Api((JSON.parse(line) as { url: string }).url, key) }
}

async function stop(child: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const gone = new Promise((resolve) => child.once('exit', resolve))
  child.kill(signal)
  await gone
}

afterAll(async () => {
  for (const child of children) await stop(child, 'SIGTERM')
  for (const dir of dataDirs) {
    releasePoolImage(path.join(dir, 'pool.img'))
    await rm(dir, { recursive: true, force: true })
  }
  for (const dir of runDirs) await rm(dir, { recursive: true, force: true })
})

describe('a data dir belongs to one server', () => {
  it('refuses a second server on a running one’s data dir before touching anything; after kill -9 a new one starts', async () => {
    assertBuilt()
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-owner-'))
    dataDirs.push(dataDir)
    const first = await launch(dataDir)
    const api = first.api as Api
    expect(api, 'the first server starts').toBeDefined()
    const slow = await makeProject({
      'cairn.yaml': 'name: slow\ncommand: python3 slow.py\n',
      'slow.py':
        'import time\nwhile True:\n    line = input()\n    open("log.txt", "a").write(line + "\\n")\n    time.sleep(3)\n    print("done " + line, flush=True)\n',
    })
    expect((await api.call('POST', '/v1/agents', await packDir(slow))).status).toBe(201)
    const session = await api.createSession('slow')
    const inFlight = api.send(session.id, 'one')
    await new Promise((r) => setTimeout(r, 500))

    // The same dir by its path, through a symlink, and by the CLI as an operator would type it.
    const link = path.join(await scratchDir('cairn-owner-link-'), 'data')
    await symlink(dataDir, link)
    runDirs.push(instanceRunDir(link))
    for (const dir of [dataDir, link]) {
      const second = await launch(dir)
      expect(second.api, `a second server on ${dir} must not start`).toBeUndefined()
      const { code, stderr } = await second.exited
      expect(code).not.toBe(0)
      expect(stderr).toContain('is in use by another Cairn server')
      expect(stderr).toContain(`pid ${first.child.pid}`)
    }
    const cli = spawnCli(['server', '--data-dir', dataDir, '--port', '0'], { CAIRN_SPARE_LAUNCHERS: '0' })
    const refused = await cli.done
    expect(refused.code).not.toBe(0)
    expect(refused.stderr).toContain(`is in use by another Cairn server (pid ${first.child.pid},`)

    // The first server lost nothing: the in-flight turn ends, the session goes on, the pool answers.
    const turn = await inFlight
    expect(turn.terminal?.type).toBe('run.completed')
    expect(turn.text).toBe('done one\n')
    expect((await api.send(session.id, 'two')).text).toBe('done two\n')
    const info = await api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body.status).toBe('idle')
    const files = await api.call('GET', `/v1/sessions/${session.id}/files/content?path=log.txt`)
    expect(files.status).toBe(200)
    const snapshot = await api.call('POST', `/v1/sessions/${session.id}/snapshots`, { label: 'kept' })
    expect(snapshot.status).toBe(201)
    const other = await api.createSession('slow')
    expect((await api.send(other.id, 'three')).text).toBe('done three\n')

    // The lock dies with its holder: after kill -9, a new server takes the dir at once.
    await stop(first.child, 'SIGKILL')
    const next = await launch(dataDir)
    expect(next.api, 'a server starts after its predecessor was killed').toBeDefined()
    expect((await (next.api as Api).send(session.id, 'four')).text).toBe('done four\n')
    await stop(next.child, 'SIGTERM')
    expect((await next.exited).code).toBe(0)

    // A server killed while it ran from another path (its own run dir) leaves the pool mounted
    // there: the next start takes the lock, but does not mount the image a second time.
    const viaLink = await launch(link)
    expect(viaLink.api).toBeDefined()
    await stop(viaLink.child, 'SIGKILL')
    const afterLink = await launch(dataDir)
    expect(afterLink.api, 'the pool is still mounted elsewhere').toBeUndefined()
    const { code, stderr } = await afterLink.exited
    expect(code).not.toBe(0)
    expect(stderr).toContain(`is already mounted at ${instanceRunDir(link)}/pool`)
  })
})

describe('a storage pool given by path belongs to one server', () => {
  it('refuses a second server (another data dir) on a pool in use, before it touches the pool', async () => {
    const poolPath = await scratchDir('cairn-shared-pool-')
    const server = { storage: 'dir' as const, poolPath, spareLaunchers: 0 }
    const first = await startTestServer({ dataDir: await scratchDir('cairn-pool-a-'), server })
    try {
      expect((await first.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
      const session = await first.api.createSession('echo')
      await expect(startTestServer({ dataDir: await scratchDir('cairn-pool-b-'), server })).rejects.toThrow(
        `storage pool ${poolPath} is in use by another Cairn server (pid ${process.pid},`,
      )
      // The first server's workspace was not taken for an orphan of the second's database.
      expect((await first.api.send(session.id, 'still mine')).text).toBe('still mine\n')
    } finally {
      await first.close()
    }
    const next = await startTestServer({ dataDir: await scratchDir('cairn-pool-b-'), server })
    await next.close()
  })
})

describe('a stopped server leaves nothing behind', () => {
  it('removes its whole run dir (memory mounts included) on a graceful stop', async () => {
    const dataDir = await scratchDir('cairn-rundir-')
    const t = await startTestServer({ dataDir })
    const runDir = instanceRunDir(dataDir)
    expect(existsSync(runDir)).toBe(true)
    expect((await t.api.deploy(`${EXAMPLES}/echo`)).status).toBe(201)
    const session = await t.api.createSession('echo')
    expect((await t.api.send(session.id, 'hi')).text).toBe('hi\n')
    expect(existsSync(path.join(runDir, 'memory')), 'a turn binds the agent memory from the run dir').toBe(
      true,
    )
    await t.close()
    expect(existsSync(runDir), `${runDir} is left behind`).toBe(false)
  })

  it('a SIGTERM while `cairn server` starts is a clean stop once it has started, not a death with its pool mounted', async () => {
    // Sent as soon as the server makes its run dir, about to mount its pool: the signal used to
    // meet Node's default there (nothing listened before the address was printed) and end the
    // process with the pool mounted. It is now a clean stop once the start is done.
    const dataDir = path.join(await scratchDir('cairn-early-term-'), 'data')
    dataDirs.push(dataDir)
    const runDir = instanceRunDir(dataDir)
    runDirs.push(runDir)
    const home = path.join(dataDir, '..', 'home')
    const child = spawn(
      process.execPath,
      [CLI_BIN, 'server', '--data-dir', dataDir, '--port', '0', '--json'],
      {
        stdio: 'ignore',
        env: { ...process.env, HOME: home, XDG_CONFIG_HOME: home },
      },
    )
    children.push(child)
    const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      child.once('exit', (code, signal) => resolve({ code, signal })),
    )
    while (!existsSync(runDir) && child.exitCode === null) await new Promise((r) => setTimeout(r, 2))
    child.kill('SIGTERM')
    expect(await exit).toEqual({ code: 0, signal: null })
    expect(existsSync(runDir), `${runDir} is left behind`).toBe(false)
  }, 60_000)
})
