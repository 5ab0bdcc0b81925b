import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process'
import { existsSync, readFileSync, rmSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { instanceRunDir } from '@cairn/runtime'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { releasePoolImage, scratchDir } from './helpers/scratch.js'
import { EXAMPLES, REPO_ROOT } from './helpers/server.js'

// The release artifact (scripts/build-deb.sh) installed as an operator installs it: `dpkg -i`, then
// `cairn` from /usr/bin in a directory that is not the checkout, with a data dir of its own. It
// answers a session, stops cleanly, and the package's removal leaves nothing of it behind.

const INSTALLED_CLI = '/usr/bin/cairn'
const LIB_DIR = '/usr/lib/cairn'

let scratch: string
let deb: string
let installedHere = false
let server: ChildProcess | undefined

/** Whether a package named cairn is installed (by anything: then this test may not replace it). */
function packageInstalled(): boolean {
  const query = spawnSync('dpkg-query', ['-W', '-f', '${Status}', 'cairn'], { encoding: 'utf8' })
  return query.status === 0 && query.stdout.includes('install ok installed')
}

/** Runs the installed CLI in the scratch dir, as a user of the package would. */
function installedCairn(args: string[], env: Record<string, string>, input?: string): string {
  return execFileSync(INSTALLED_CLI, args, {
    cwd: scratch,
    input,
    encoding: 'utf8',
    timeout: 120_000,
    env: { PATH: process.env.PATH ?? '', HOME: scratch, NO_COLOR: '1', ...env },
  })
}

beforeAll(async () => {
  scratch = await scratchDir('cairn-release-')
  expect(packageInstalled(), 'a cairn package is installed on this machine already').toBe(false)
  deb = execFileSync('bash', [path.join(REPO_ROOT, 'scripts/build-deb.sh'), '--no-build', scratch], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: 300_000,
  }).trim()
  execFileSync('dpkg', ['--force-unsafe-io', '-i', deb], { stdio: 'pipe', timeout: 300_000 })
  installedHere = true
}, 600_000)

afterAll(() => {
  if (server?.pid !== undefined && server.exitCode === null) server.kill('SIGKILL')
  if (installedHere) spawnSync('dpkg', ['--purge', 'cairn'], { stdio: 'ignore', timeout: 120_000 })
  if (scratch) {
    const dataDir = path.join(scratch, 'data')
    for (const point of mountsUnder(instanceRunDir(dataDir)).reverse()) spawnSync('umount', ['-l', point])
    releasePoolImage(path.join(dataDir, 'pool.img'))
    rmSync(instanceRunDir(dataDir), { recursive: true, force: true })
  }
})

/** What is mounted at or below `dir`. */
function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((point) => point === dir || point.startsWith(`${dir}/`))
}

describe('the Debian package (scripts/build-deb.sh)', () => {
  it('holds the CLI, the systemd units pointing at it, and a Depends line for what running needs', () => {
    const control = execFileSync('dpkg-deb', ['-f', deb, 'Package', 'Depends'], { encoding: 'utf8' })
    expect(control).toMatch(/^Package: cairn$/m)
    expect(control).toMatch(/Depends: nodejs \(>= \d+\).*bubblewrap.*btrfs-progs/)
    for (const unit of ['cairn-server.service', 'cairn-node.service']) {
      const text = readFileSync(`/lib/systemd/system/${unit}`, 'utf8')
      const binary = /^ExecStart=(\S+)/m.exec(text)?.[1]
      expect(binary, unit).toBe(INSTALLED_CLI)
    }
    // The runtime's helpers and the agent kit the sandboxes are given (files outside dist/).
    for (const file of ['packages/runtime/helpers/btrfs_ops.py', 'packages/agent-kit/egress/forward.py'])
      expect(existsSync(path.join(LIB_DIR, file)), file).toBe(true)
    expect(installedCairn(['--version'], {}).trim()).toMatch(/^\d+\.\d+\.\d+/)
  })

  it('installed, `cairn server` answers a session deployed by the installed CLI, and stops cleanly', async () => {
    const dataDir = path.join(scratch, 'data')
    server = spawn(INSTALLED_CLI, ['server', '--data-dir', dataDir, '--port', '0', '--json'], {
      cwd: scratch,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { PATH: process.env.PATH ?? '', HOME: scratch, NO_COLOR: '1' },
    })
    let stderr = ''
    server.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk
    })
    const exited = new Promise<number | null>((resolve) => server?.once('close', (code) => resolve(code)))
    const line = await Promise.race([
      new Promise<string>((resolve) =>
        createInterface({ input: server?.stdout as NodeJS.ReadableStream }).once('line', resolve),
      ),
      exited.then(() => undefined),
    ])
    expect(line, `the installed server did not start: ${stderr}`).toBeDefined()
    const url = (JSON.parse(line as string) as { url: string }).url
    const env = {
      CAIRN_API_URL: url,
      CAIRN_API_KEY: (await readFile(path.join(dataDir, 'admin.key'), 'utf8')).trim(),
    }
    installedCairn(['deploy', path.join(EXAMPLES, 'echo'), '--yes'], env)
    expect(installedCairn(['run', 'echo'], env, 'from the package\n')).toContain('from the package')

    server.kill('SIGTERM')
    expect(await exited).toBe(0)
    expect(mountsUnder(instanceRunDir(dataDir))).toEqual([])
  })

  it('removed with --purge, leaves none of its files', () => {
    execFileSync('dpkg', ['--purge', 'cairn'], { stdio: 'pipe', timeout: 120_000 })
    installedHere = false
    expect(packageInstalled()).toBe(false)
    for (const file of [
      INSTALLED_CLI,
      LIB_DIR,
      '/lib/systemd/system/cairn-server.service',
      '/etc/cairn/cairn.env.example',
    ])
      expect(existsSync(file), file).toBe(false)
  })
})
