import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { mkdir, mkdtemp, rm, symlink } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, type CliResult, spawnCli, waitFor } from './helpers/cli.js'

// `cairn doctor` on this host, and with each requirement taken away: a binary missing from a PATH
// of the test's own (every other binary of the host linked there), a pool path on tmpfs, no root.
// `cairn server` refuses or degrades with the same words.

interface Check {
  id: string
  ok: boolean
  need: string
  what: string
  found: string
  costs: string
  fix: string
}
interface Report {
  canStart: boolean
  refused: string[]
  degraded: string[]
  checks: Check[]
}

const HOST_BIN_DIRS = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin']

let scratch: string
let dataDir: string

/** A directory of links to every binary on the host's PATH but `missing`: a PATH without them. */
async function pathWithout(...missing: string[]): Promise<string> {
  const dir = await mkdtemp(path.join(scratch, 'bin-'))
  for (const from of HOST_BIN_DIRS) {
    if (!existsSync(from)) continue
    for (const name of readdirSync(from)) {
      if (missing.includes(name) || existsSync(path.join(dir, name))) continue
      await symlink(path.join(from, name), path.join(dir, name))
    }
  }
  return dir
}

function doctor(args: string[], env: Record<string, string> = {}): Promise<CliResult> {
  return spawnCli(['doctor', '--data-dir', dataDir, ...args], env).done
}

async function doctorJson(args: string[], env: Record<string, string> = {}) {
  const result = await doctor(['--json', ...args], env)
  return { code: result.code, report: JSON.parse(result.stdout) as Report, stderr: result.stderr }
}

function escaped(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
}

function check(report: Report, id: string): Check {
  const found = report.checks.find((c) => c.id === id)
  if (!found) throw new Error(`no check ${id}`)
  return found
}

beforeAll(async () => {
  assertBuilt()
  scratch = await mkdtemp(path.join(os.tmpdir(), 'cairn-doctor-'))
  dataDir = path.join(scratch, 'data')
})

afterAll(async () => {
  await rm(scratch, { recursive: true, force: true })
})

describe('cairn doctor', () => {
  it('on this host: every check it needs works, each named with its area and what it found; exit 0', async () => {
    const { code, report } = await doctorJson([])
    expect(report.refused).toEqual([])
    expect(report.degraded).toEqual([])
    expect(report.canStart).toBe(true)
    expect(code).toBe(0)
    const ids = report.checks.map((c) => c.id)
    for (const id of [
      'root',
      'user-namespaces',
      'seccomp',
      'cgroups',
      'btrfs',
      'btrfs-progs',
      'loop-devices',
      'idmapped-mounts',
      'warm-sessions',
      'nftables',
      'bwrap',
      'runsc',
      'criu',
      'mmdebstrap',
      'skopeo',
    ])
      expect(ids).toContain(id)
    expect(check(report, 'idmapped-mounts')).toMatchObject({
      ok: true,
      found: expect.stringMatching(/^made one on /),
    })
    expect(check(report, 'user-namespaces')).toMatchObject({
      ok: true,
      found: expect.stringMatching(/^made one/),
    })
    // The machine's room for warm sessions, with both of its bounds and their numbers.
    const pidMax = readFileSync('/proc/sys/kernel/pid_max', 'utf8').trim()
    expect(check(report, 'warm-sessions')).toMatchObject({
      need: 'info',
      found: expect.stringMatching(
        new RegExp(
          `^about [\\d,]+: kernel\\.pid_max ${Number(pidMax).toLocaleString('en-US')} .*; open files [\\d,]+, 1 a session`,
        ),
      ),
    })
    // The probes leave nothing behind.
    expect(existsSync(dataDir)).toBe(false)
    const human = await doctor([])
    expect(human.code).toBe(0)
    expect(human.stdout).toMatch(/✓ bubblewrap \(bwrap\) +\/\S+\/bwrap \(bubblewrap /)
    expect(human.stdout).toContain('cairn server has everything it uses here.')
  })

  it.each([
    {
      missing: ['bwrap'],
      args: [],
      id: 'bwrap',
      code: 1,
      found: 'bwrap is not on the PATH',
      fix: 'apt-get install bubblewrap',
    },
    {
      missing: ['runsc'],
      args: [],
      id: 'runsc',
      code: 3,
      found: 'runsc is not on the PATH',
      fix: 'apt-get install runsc',
    },
    {
      missing: ['runsc'],
      args: ['--isolation', 'gvisor'],
      id: 'runsc',
      code: 1,
      found: 'runsc is not on the PATH',
      fix: 'apt-get install runsc',
    },
    {
      missing: ['mmdebstrap'],
      args: [],
      id: 'mmdebstrap',
      code: 3,
      found: 'mmdebstrap is not on the PATH',
      fix: 'apt-get install mmdebstrap',
    },
    {
      missing: ['skopeo'],
      args: [],
      id: 'skopeo',
      code: 3,
      found: 'skopeo is not on the PATH',
      fix: 'apt-get install skopeo umoci',
    },
    {
      missing: ['umoci'],
      args: [],
      id: 'skopeo',
      code: 3,
      found: 'umoci is not on the PATH',
      fix: 'apt-get install skopeo umoci',
    },
    {
      missing: ['mkfs.btrfs'],
      args: [],
      id: 'btrfs-progs',
      code: 1,
      found: 'mkfs.btrfs is not on the PATH',
      fix: 'apt-get install btrfs-progs',
    },
    {
      missing: ['mkfs.btrfs'],
      args: ['--storage', 'dir'],
      id: 'btrfs-progs',
      code: 0,
      found: 'mkfs.btrfs is not on the PATH',
      fix: 'apt-get install btrfs-progs',
    },
    {
      missing: ['losetup'],
      args: [],
      id: 'loop-devices',
      code: 1,
      found: 'losetup is not on the PATH',
      fix: 'modprobe loop',
    },
    {
      missing: ['ip'],
      args: [],
      id: 'nftables',
      code: 3,
      found: 'ip is not on the PATH',
      fix: 'apt-get install nftables iproute2',
    },
  ])('without $missing on the PATH ($args): names $id, what it costs and the fix; exit $code', async (c) => {
    const PATH = await pathWithout(...c.missing)
    const { code, report } = await doctorJson(c.args, { PATH })
    const failed = check(report, c.id)
    expect(failed).toMatchObject({ ok: false, found: c.found, fix: expect.stringContaining(c.fix) })
    expect(failed.costs.length).toBeGreaterThan(0)
    expect(report.checks.filter((k) => !k.ok && k.need !== 'info').map((k) => k.id)).toEqual(
      c.code === 0 ? [] : [c.id],
    )
    expect(report.refused).toEqual(c.code === 1 ? [c.id] : [])
    expect(report.degraded).toEqual(c.code === 3 ? [c.id] : [])
    expect(report.canStart).toBe(c.code !== 1)
    expect(code).toBe(c.code)
  })

  it('on a terminal: a missing requirement is marked, with what it costs and the fix, and the verdict', async () => {
    const PATH = await pathWithout('bwrap', 'runsc')
    const { report } = await doctorJson([], { PATH })
    const human = await doctor([], { PATH })
    expect(human.code).toBe(1)
    for (const [id, mark] of [
      ['bwrap', '✗'],
      ['runsc', '!'],
    ] as const) {
      const failed = check(report, id)
      expect(human.stdout).toMatch(new RegExp(`${mark} ${escaped(failed.what)} +${escaped(failed.found)}\n`))
      expect(human.stdout).toContain(`costs: ${failed.costs}`)
      expect(human.stdout).toContain(`fix:   ${failed.fix}`)
    }
    expect(human.stdout).toContain('cairn server would refuse to start here: it needs bubblewrap (bwrap).')
  })

  it('a pool path on tmpfs: btrfs is missing there, named with the fix; loop devices are not needed; exit 1', async () => {
    const pool = await mkdtemp(path.join('/dev/shm', 'cairn-doctor-pool-'))
    try {
      const { code, report } = await doctorJson(['--pool-path', pool])
      expect(check(report, 'btrfs')).toMatchObject({
        ok: false,
        need: 'required',
        found: `${pool} is on tmpfs, not btrfs`,
        fix: expect.stringContaining('--pool-path on a btrfs filesystem'),
      })
      expect(check(report, 'loop-devices').need).toBe('info')
      expect(report.refused).toEqual(['btrfs'])
      expect(code).toBe(1)
      // With the dir driver the same path is fine.
      const dir = await doctorJson(['--pool-path', pool, '--storage', 'dir'])
      expect(dir.report.refused).toEqual([])
      expect(dir.code).toBe(0)
    } finally {
      await rm(pool, { recursive: true, force: true })
    }
  })

  it('not root: the permission is named with its fix; exit 1', async () => {
    const nobody = await spawnCli(
      ['doctor', '--json', '--data-dir', path.join(scratch, 'nobody')],
      { HOME: '/nonexistent' },
      { runAs: 65534 },
    ).done
    const report = JSON.parse(nobody.stdout) as Report
    expect(check(report, 'root')).toMatchObject({
      ok: false,
      found: 'running as uid 65534',
      fix: expect.stringContaining('sudo'),
    })
    expect(report.refused).toContain('root')
    expect(nobody.code).toBe(1)
  })
})

describe('cairn server runs the same checks at start', () => {
  it("refuses without what it cannot run without (bwrap), in the doctor's words, touching nothing", async () => {
    const PATH = await pathWithout('bwrap')
    const serverDir = path.join(scratch, 'refused')
    const result = await spawnCli(['server', '--data-dir', serverDir, '--port', '0', '--storage', 'dir'], {
      PATH,
    }).done
    const { report } = await doctorJson(['--storage', 'dir'], { PATH })
    const bwrap = check(report, 'bwrap')
    expect(result.code).toBe(1)
    expect(result.stderr).toContain(`${bwrap.what}: ${bwrap.found}; costs ${bwrap.costs}; fix: ${bwrap.fix}`)
    expect(result.stderr).toContain('`cairn doctor` shows every check')
    expect(existsSync(serverDir)).toBe(false)
  })

  it("starts without a feature (runsc) and logs it in the doctor's words", async () => {
    const PATH = await pathWithout('runsc')
    const serverDir = path.join(scratch, 'degraded')
    await mkdir(serverDir)
    const server = spawnCli(
      ['server', '--data-dir', path.join(serverDir, 'data'), '--port', '0', '--storage', 'dir'],
      { PATH },
    )
    try {
      await waitFor(
        () => server.output().stdout.includes('Cairn server listening'),
        60_000,
        'the server to listen',
      )
    } finally {
      server.child.kill('SIGINT')
    }
    const stopped = await server.done
    expect(stopped.code).toBe(0)
    const { report } = await doctorJson(['--storage', 'dir'], { PATH })
    const runsc = check(report, 'runsc')
    const logged = (stopped.stdout + stopped.stderr)
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as { level: number; check?: string; msg: string })
      .filter((line) => line.check !== undefined)
    expect(logged).toEqual([
      expect.objectContaining({
        level: 40,
        check: 'runsc',
        msg: `${runsc.what}: ${runsc.found}; costs ${runsc.costs}; fix: ${runsc.fix}`,
      }),
    ])
  })
})
