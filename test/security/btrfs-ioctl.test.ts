import { execFileSync } from 'node:child_process'
import { chownSync, existsSync, readFileSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { DRIVERS, probeDrivers, SANDBOX_UID } from '../conformance/harness.js'
import { askProbe, probeProjectFiles } from '../helpers/probe.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

/**
 * The workspace is a subvolume of the host's btrfs pool, shared by every session. A btrfs ioctl
 * from inside a sandbox reached the pool: SNAP_DESTROY_V2 by subvolume id deleted other sessions'
 * nested subvolumes (and its answers told which ids exist), SUBVOL_CREATE made a subvolume outside
 * the workspace's quota group. A sandbox may issue no btrfs ioctl (type byte 0x94) at all.
 */
const QUOTA_MIB = 50
const EPERM = 'Operation not permitted'
const drivers = await probeDrivers()
let t: TestServer

beforeAll(async () => {
  t = await startTestServer({ server: { workspaceQuotaMiB: QUOTA_MIB } })
  for (const isolation of DRIVERS.filter((d) => drivers[d].ok)) {
    const project = await makeProject(probeProjectFiles(`ioctl-${isolation}`, isolation, true))
    expect((await t.api.deploy(project)).status).toBe(201)
  }
})

afterAll(async () => {
  await t?.close()
})

const ask = (sessionId: string, message: string) => askProbe(t.api, sessionId, message)

/** Every subvolume of the pool, by id (`btrfs subvolume list`, as root on the host). */
function subvolumes(): Map<number, string> {
  const out = execFileSync('btrfs', ['subvolume', 'list', t.server.runtime.pool.root], { encoding: 'utf8' })
  const found = new Map<number, string>()
  for (const line of out.split('\n')) {
    const match = /^ID (\d+) .* path (.+)$/.exec(line)
    if (match?.[1] && match[2]) found.set(Number(match[1]), match[2])
  }
  return found
}

describe.each(DRIVERS)('%s driver: btrfs ioctls from inside the sandbox', (isolation) => {
  const test = it.skipIf(!drivers[isolation].ok)
  const agent = `ioctl-${isolation}`
  let attacker = ''
  let victim = ''

  beforeAll(async () => {
    if (!drivers[isolation].ok) return
    attacker = (await t.api.createSession(agent)).id
    victim = (await t.api.createSession(agent)).id
    expect(await ask(victim, 'write keep.txt the victim keeps this')).toBe('wrote keep.txt')
    // A nested subvolume in the victim's workspace, owned by the sandbox uid as if the victim had
    // made it (as it could before this fix; pools made then still hold such subvolumes).
    const nested = path.join(t.server.runtime.pool.workspacePath(victim), 'nested')
    execFileSync('btrfs', ['subvolume', 'create', nested], { stdio: 'ignore' })
    writeFileSync(path.join(nested, 'data.txt'), 'nested victim data')
    chownSync(nested, SANDBOX_UID, SANDBOX_UID)
    chownSync(path.join(nested, 'data.txt'), SANDBOX_UID, SANDBOX_UID)
  })

  test("SNAP_DESTROY_V2 by id over every subvolume id deletes nothing, tells nothing, and the victim's turns go on", async () => {
    const before = subvolumes()
    const victimSnapshot = await t.api.snapshotAfter(victim, 1)
    expect(existsSync(t.server.runtime.pool.snapshotPath(victimSnapshot))).toBe(true)
    const ids = [...before.keys()]
    const hi = Math.max(...ids) + 20
    const answers = JSON.parse(await ask(attacker, `destroy-ids 256 ${hi}`)) as Record<string, number>
    // One answer for every id: existing or not, nothing to enumerate.
    expect(answers).toEqual({ [EPERM]: hi - 256 + 1 })
    const after = subvolumes()
    for (const [id, where] of before) expect(after.get(id), `subvolume ${id} (${where})`).toBe(where)
    const nested = path.join(t.server.runtime.pool.workspacePath(victim), 'nested', 'data.txt')
    expect(readFileSync(nested, 'utf8')).toBe('nested victim data')
    expect(existsSync(t.server.runtime.pool.snapshotPath(victimSnapshot))).toBe(true)
    // The victim's sandbox still works on its files.
    expect(await ask(victim, 'cat nested/data.txt')).toBe('nested victim data')
    expect(await ask(victim, 'cat keep.txt')).toBe('the victim keeps this')
    expect(await ask(victim, 'write after.txt still mine')).toBe('wrote after.txt')
  })

  test('SUBVOL_CREATE is refused, so writes stay under the workspace quota and in its sizes', async () => {
    const outcome = await ask(attacker, 'subvol-escape 300')
    expect(outcome).toMatch(new RegExp(`^create=${EPERM} EDQUOT after \\d+ MiB$`))
    const written = Number(/after (\d+) MiB/.exec(outcome)?.[1])
    expect(written).toBeGreaterThanOrEqual(QUOTA_MIB - 10)
    expect(written).toBeLessThanOrEqual(QUOTA_MIB)
    // No subvolume inside the workspace (the pool's own snapshots come and go meanwhile), and the
    // workspace's size shows what was written.
    const workspace = t.server.runtime.pool.workspacePath(attacker)
    const inside = `${path.relative(t.server.runtime.pool.root, workspace)}/`
    expect([...subvolumes().values()].filter((p) => p.startsWith(inside))).toEqual([])
    const usage = await t.server.runtime.pool.usage(workspace)
    expect(usage.referencedBytes).toBeGreaterThanOrEqual((written - 1) * 1024 * 1024)
    expect(usage.referencedBytes).toBeLessThanOrEqual(QUOTA_MIB * 1024 * 1024)
    expect(await ask(victim, 'cat keep.txt')).toBe('the victim keeps this')
  })
})
