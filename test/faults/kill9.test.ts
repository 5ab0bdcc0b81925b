import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { existsSync, readdirSync } from 'node:fs'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { instanceRunDir } from '@cairn/runtime'
import { afterAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { releasePoolImage } from '../helpers/scratch.js'
import { Api, packDir, REPO_ROOT } from '../helpers/server.js'

const FIXTURE = path.join(REPO_ROOT, 'test/fixtures/server-process.mjs')
const ROUNDS = Number(process.env.CAIRN_KILL_ROUNDS ?? 50)
const children: ChildProcess[] = []
let dataDir = ''

async function launch(dir: string): Promise<{ child: ChildProcess; api: Api }> {
  const child = spawn(process.execPath, [FIXTURE, dir], { stdio: ['ignore', 'pipe', 'inherit'] })
  children.push(child)
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).once('line', resolve)
    child.once('exit', (code) => reject(new Error(`server exited early with ${code}`)))
  })
  const key = (await readFile(path.join(dir, 'admin.key'), 'utf8')).trim()
  return { child, api: new Api((JSON.parse(line) as { url: string }).url, key) }
}

const killed = (child: ChildProcess) =>
  new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    child.once('exit', () => resolve())
    child.kill('SIGKILL')
  })

/** The generation marker inside a workspace subvolume (read as root, like the server does). */
function generationMarker(dir: string): number {
  const out = execFileSync('python3', [
    '-c',
    'import os, sys; print(int(os.getxattr(sys.argv[1], "trusted.cairn.generation")))',
    dir,
  ])
  return Number(out.toString().trim())
}

afterAll(async () => {
  for (const child of children) await killed(child)
  if (dataDir) {
    const second = await launch(dataDir).catch(() => undefined)
    if (second) {
      second.child.kill('SIGTERM')
      await new Promise((r) => second.child.once('exit', r))
    }
    releasePoolImage(path.join(dataDir, 'pool.img'))
    await rm(dataDir, { recursive: true, force: true })
  }
})

describe('kill -9 at random points', () => {
  it(`${ROUNDS} kills during turns, snapshots, restores and deploys leave nothing stuck, orphaned or lost`, async () => {
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-kill9-'))
    const project = await makeProject({
      'cairn.yaml': 'name: worker\ncommand: python3 worker.py\n',
      'worker.py':
        'import time\nwhile True:\n    line = input()\n    open("log.txt", "a").write(line + "\\n")\n    time.sleep(0.05)\n    print(open("log.txt").read().count("\\n"))\n',
    })
    const archive = await packDir(project)
    let { child, api } = await launch(dataDir)
    expect((await api.call('POST', '/v1/agents', archive)).status).toBe(201)
    const sessions = [(await api.createSession('worker')).id, (await api.createSession('worker')).id]
    const runDir = instanceRunDir(dataDir)
    for (let round = 0; round < ROUNDS; round++) {
      const target = sessions[round % sessions.length] as string
      const op = round % 4
      const action =
        op === 0
          ? api.send(target, `round ${round}`)
          : op === 1
            ? api.call('POST', `/v1/sessions/${target}/snapshots`, { label: `r${round}` })
            : op === 2
              ? api.call('POST', `/v1/sessions/${target}/restore`, { turn: 0 })
              : api.call('POST', '/v1/agents', archive)
      void action.catch(() => undefined)
      await new Promise((r) => setTimeout(r, Math.floor(Math.random() * 120)))
      await killed(child)
      ;({ child, api } = await launch(dataDir))
      for (const id of sessions) {
        const info = await api.call('GET', `/v1/sessions/${id}`)
        expect(info.status, `round ${round}`).toBe(200)
        expect(info.body.status, `round ${round}: ${JSON.stringify(info.body)}`).not.toBe('active')
        const workspace = path.join(runDir, 'pool', 'sessions', id)
        expect(existsSync(workspace), `round ${round}: workspace of ${id}`).toBe(true)
        // The workspace is at the generation the database last recorded (never behind it).
        expect(info.body.statusCause, `round ${round}`).not.toBe('state_lost')
        expect(generationMarker(workspace), `round ${round}: generation of ${id}`).toBe(info.body.generation)
      }
      // Exactly one mount of the pool, no stale staging, no sandbox cgroup left by the killed server.
      const mounts = (await readFile('/proc/self/mountinfo', 'utf8'))
        .split('\n')
        .filter((l) => l.includes(`${runDir}/pool `))
      expect(mounts, `round ${round}`).toHaveLength(1)
      expect(readdirSync(path.join(runDir, 'pool', 'staging')), `round ${round}`).toEqual([])
    }
    for (const id of sessions) {
      await api.call('POST', `/v1/sessions/${id}/resume`)
      const last = await api.send(id, 'final')
      expect(last.terminal?.type, JSON.stringify(last.events)).toBe('run.completed')
    }
    child.kill('SIGTERM')
    await new Promise((r) => child.once('exit', r))
  }, 600_000)
})
