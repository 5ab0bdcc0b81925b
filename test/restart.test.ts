import { type ChildProcess, spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { instanceRunDir } from '@cairn/runtime'
import { afterAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { Api, REPO_ROOT } from './helpers/server.js'

const FIXTURE = path.join(REPO_ROOT, 'test/fixtures/server-process.mjs')
const started: ChildProcess[] = []
let dataDir = ''

async function launch(dir: string): Promise<{ child: ChildProcess; api: Api }> {
  const child = spawn(process.execPath, [FIXTURE, dir], { stdio: ['ignore', 'pipe', 'inherit'] })
  started.push(child)
  const line = await new Promise<string>((resolve, reject) => {
    const rl = createInterface({ input: child.stdout as NodeJS.ReadableStream })
    rl.once('line', resolve)
    child.once('exit', (code) => reject(new Error(`server exited early with ${code}`)))
  })
  const { url } = JSON.parse(line) as { url: string }
  const key = (await readFile(path.join(dir, 'admin.key'), 'utf8')).trim()
  return { child, api: new Api(url, key) }
}

function exited(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve()
    else child.once('exit', () => resolve())
  })
}

afterAll(async () => {
  for (const child of started) {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM')
      await exited(child)
    }
  }
  if (dataDir) await rm(dataDir, { recursive: true, force: true })
})

describe('a killed server', () => {
  it('comes back after kill -9 with workspace and transcript intact and the interrupted turn marked', async () => {
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-restart-'))
    const first = await launch(dataDir)
    const project = await makeProject({
      'cairn.yaml': 'name: journal\ncommand: python3 journal.py\n',
      'journal.py': [
        'import time',
        'while True:',
        '    line = input()',
        '    if line == "sleep":',
        '        time.sleep(30)',
        '    with open("journal.txt", "a") as f:',
        '        f.write(line + "\\n")',
        '    print(open("journal.txt").read().strip().replace("\\n", ","))',
      ].join('\n'),
    })
    expect((await first.api.deploy(project)).status).toBe(201)
    const session = await first.api.createSession('journal')
    expect((await first.api.send(session.id, 'alpha')).text).toBe('alpha\n')
    expect((await first.api.send(session.id, 'beta')).text).toBe('alpha,beta\n')
    // A turn is running when the server dies.
    void first.api.send(session.id, 'sleep').catch(() => undefined)
    await new Promise((r) => setTimeout(r, 400))
    first.child.kill('SIGKILL')
    await exited(first.child)

    const second = await launch(dataDir)
    const info = await second.api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body).toMatchObject({ status: 'idle', statusCause: 'server_restart' })
    const turns = await second.api.call('GET', `/v1/sessions/${session.id}/turns`)
    expect(turns.body.data.map((t: { status: string }) => t.status)).toEqual([
      'completed',
      'completed',
      'interrupted',
    ])

    const resolved = await second.api.call('GET', `/v1/sessions/resolve?prefix=${session.id.slice(0, 12)}`)
    expect(resolved.body.id).toBe(session.id)
    const resumed = await second.api.call('POST', `/v1/sessions/${session.id}/resume`)
    expect(resumed.status).toBe(200)
    expect((await second.api.send(session.id, 'gamma')).text).toBe('alpha,beta,gamma\n')
    const transcript = await second.api.call('GET', `/v1/sessions/${session.id}/messages`)
    expect(
      transcript.body.data
        .filter((m: { role: string }) => m.role === 'user')
        .map((m: { content: string }) => m.content),
    ).toEqual(['alpha', 'beta', 'sleep', 'gamma'])

    second.child.kill('SIGTERM')
    await exited(second.child)
    // A clean stop leaves no mount behind.
    const mounts = await readFile('/proc/self/mountinfo', 'utf8')
    expect(mounts).not.toContain(instanceRunDir(dataDir))
    expect(existsSync(path.join(dataDir, 'pool.img'))).toBe(true)
  })
})
