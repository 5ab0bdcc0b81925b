import { execFile, execFileSync } from 'node:child_process'
import { readFile, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { describe, expect, it } from 'vitest'
import { scratchDir } from '../helpers/scratch.js'

const REPO = fileURLToPath(new URL('../..', import.meta.url))
const UNITS = path.join(REPO, 'deploy/systemd')
const CLI = path.join(REPO, 'packages/cli/bin/cairn.js')
const run = promisify(execFile)

function systemdAnalyze(): string | undefined {
  try {
    execFileSync('systemd-analyze', ['--version'], { stdio: 'ignore' })
    return 'systemd-analyze'
  } catch {
    return undefined
  }
}

/**
 * The units as installed, in a scratch dir, with one change: ExecStart names this checkout's CLI,
 * because `verify` checks that the program exists and /usr/local/bin/cairn may not (scripts/link-cli.sh).
 */
async function unitsDir(plant?: { unit: string; from: string; to: string }): Promise<string> {
  const dir = await scratchDir('cairn-deploy-systemd-')
  for (const unit of ['cairn-server.service', 'cairn-node.service']) {
    let text = (await readFile(path.join(UNITS, unit), 'utf8')).replace(
      /^ExecStart=\/usr\/local\/bin\/cairn /m,
      `ExecStart=${CLI} `,
    )
    if (plant?.unit === unit) {
      const planted = text.replace(plant.from, plant.to)
      expect(planted, 'the plant applies').not.toBe(text)
      text = planted
    }
    await writeFile(path.join(dir, unit), text)
  }
  return dir
}

/** `systemd-analyze verify`'s exit code and what it said (it warns, exit 0, on unknown keys and bad values). */
async function verify(dir: string, unit: string): Promise<{ code: number; said: string }> {
  try {
    const { stdout, stderr } = await run('systemd-analyze', ['verify', path.join(dir, unit)])
    return { code: 0, said: `${stdout}${stderr}`.trim() }
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string }
    return { code: e.code, said: `${e.stdout}${e.stderr}`.trim() }
  }
}

/** The exposure score `systemd-analyze security` gives a unit file (0 = fully locked down, 10 = none). */
async function exposure(dir: string, unit: string): Promise<number> {
  const { stdout } = await run('systemd-analyze', ['security', '--offline=true', path.join(dir, unit)], {
    env: { ...process.env, SYSTEMD_COLORS: '0' },
  })
  const score = /Overall exposure level for \S+: ([\d.]+)/.exec(stdout)?.[1]
  expect(score, stdout).toBeDefined()
  return Number(score)
}

describe.skipIf(!systemdAnalyze())('systemd units (systemd-analyze is on this machine)', () => {
  it('verify without a word from systemd-analyze', async () => {
    const dir = await unitsDir()
    expect(await verify(dir, 'cairn-server.service')).toEqual({ code: 0, said: '' })
    expect(await verify(dir, 'cairn-node.service')).toEqual({ code: 0, said: '' })
  })

  it('a misspelt key or a bad value is caught', async () => {
    const key = await unitsDir({
      unit: 'cairn-node.service',
      from: 'ProtectHome=yes',
      to: 'ProtectHomee=yes',
    })
    expect((await verify(key, 'cairn-node.service')).said).toContain("Unknown key 'ProtectHomee'")
    const value = await unitsDir({
      unit: 'cairn-server.service',
      from: 'KillMode=mixed',
      to: 'KillMode=mixd',
    })
    expect((await verify(value, 'cairn-server.service')).said).toContain('Failed to parse kill mode')
  })

  it('lock the API down far more than the node, which keeps what sandboxes need', async () => {
    const dir = await unitsDir()
    const api = await exposure(dir, 'cairn-server.service')
    const node = await exposure(dir, 'cairn-node.service')
    // systemd's own scale: ≤ 2 is "OK", a unit with no hardening at all is 9.6 ("UNSAFE").
    expect(api).toBeLessThanOrEqual(2)
    expect(node).toBeLessThan(7)
    const text = await readFile(path.join(UNITS, 'cairn-node.service'), 'utf8')
    expect(text).toMatch(/^KillMode=mixed$/m)
    expect(text).toMatch(/^Restart=on-failure$/m)
    expect(text).toMatch(/^ExecStop=.*cairn nodes drain/m)
  })

  it("the node's ExecStop is shell that parses, and does nothing when the node is not running", async () => {
    const text = await readFile(path.join(UNITS, 'cairn-node.service'), 'utf8')
    // systemd turns `$$` into `$` and hands the quoted word to /bin/sh -c.
    const script = /^ExecStop=-\/bin\/sh -c '(.*)'$/m.exec(text)?.[1]?.replaceAll('$$', '$')
    expect(script).toContain('cairn nodes drain "$id"')
    await run('/bin/sh', ['-n', '-c', script!])
    const { MAINPID: _, ...env } = process.env
    expect(await run('/bin/sh', ['-c', script!], { env: { ...env, CAIRN_API_KEY: 'cairn_sk_x' } })).toEqual({
      stdout: '',
      stderr: '',
    })
  })
})
