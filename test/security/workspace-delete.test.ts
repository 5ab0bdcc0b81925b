import { execFileSync, spawn } from 'node:child_process'
import { existsSync, readdirSync } from 'node:fs'
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { DirPool } from '../../packages/runtime/src/storage/dir-pool.js'
import {
  makeRevision,
  openTestRuntime,
  sessionId,
  type TestRuntime,
} from '../../packages/runtime/test/harness.js'

/**
 * Deleting a workspace in which the agent made subvolumes of its own (any user may): those go
 * first, and the walk that finds them must not be sent into another tenant's tree by a directory
 * the agent swaps for a link while the deletion runs.
 */
let t: TestRuntime

beforeAll(async () => {
  t = await openTestRuntime()
  await makeRevision(t.runtime, 'rev_del', { 'README.md': '# project\n' })
})

afterAll(async () => {
  await t?.close()
})

const NESTED = 120

/**
 * Waits until the deletion has removed one of `dir`'s nested subvolumes, then moves `dir` aside
 * and puts a link to `target` in its place (what an agent still running in the workspace can do).
 */
const SWAPPER = `
import os, sys, time
d, target, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
deadline = time.time() + 60
while time.time() < deadline:
    try:
        if len(os.listdir(d)) < total:
            break
    except OSError:
        sys.exit(0)
os.rename(d, d + ".moved")
os.symlink(target, d)
print("swapped", flush=True)
`

/**
 * Runs `remove` while the SWAPPER (given `args`) keeps exchanging the attacker's directory with a
 * link to the victim's tree; answers the removal's error (undefined: none) and what SWAPPER said.
 */
async function deleteWhileSwapping(
  remove: () => Promise<unknown>,
  args: string[],
): Promise<{ deleted: Error | undefined; output: string }> {
  const swapper = spawn('python3', ['-c', SWAPPER, ...args], { stdio: ['ignore', 'pipe', 'inherit'] })
  let output = ''
  swapper.stdout.on('data', (chunk: Buffer) => {
    output += chunk.toString()
  })
  const exited = new Promise<void>((resolve) => swapper.once('exit', () => resolve()))
  while (!output.includes('ready')) await new Promise((resolve) => setTimeout(resolve, 10))
  const deleted = await remove().then(
    () => undefined,
    (error: Error) => error,
  )
  swapper.kill()
  await exited
  return { deleted, output }
}

describe('workspace deletion', () => {
  it("deletes an agent's nested subvolumes by ID, never following a directory swapped for a link to another tenant's tree", async () => {
    const pool = t.runtime.pool
    const victim = await pool.createWorkspace(sessionId('victim'), 'rev_del', 'ten_victim')
    const attackerId = sessionId('attacker')
    const attacker = await pool.createWorkspace(attackerId, 'rev_del', 'ten_attacker')
    // The victim made subvolumes of its own, with the same names as the attacker's.
    const names = Array.from({ length: NESTED }, (_, i) => `s${i}`)
    for (const name of names) {
      execFileSync('btrfs', ['subvolume', 'create', path.join(victim, name)])
      await writeFile(path.join(victim, name, 'data'), 'victim data\n')
    }
    // The attacker: a directory of nested subvolumes, and beside it subvolumes nested in
    // subvolumes (a read-only one too), which must go before their parents.
    const dir = path.join(attacker, 'd')
    await mkdir(dir)
    for (const name of names) execFileSync('btrfs', ['subvolume', 'create', path.join(dir, name)])
    const deep = path.join(attacker, 'e', 'outer')
    await mkdir(path.dirname(deep))
    execFileSync('btrfs', ['subvolume', 'create', deep])
    execFileSync('btrfs', ['subvolume', 'create', path.join(deep, 'inner')])
    execFileSync('btrfs', [
      'subvolume',
      'snapshot',
      '-r',
      path.join(deep, 'inner'),
      path.join(deep, 'inner', 'ro'),
    ])

    const { deleted, output } = await deleteWhileSwapping(
      () => pool.deleteWorkspace(attackerId),
      [dir, victim, String(NESTED)],
    )
    // The link was in place while the deletion ran.
    expect(output).toContain('swapped')

    // Every entry of the victim's tree is still there.
    expect(names.filter((name) => !existsSync(path.join(victim, name, 'data')))).toEqual([])
    expect(deleted).toBeUndefined()
    expect(existsSync(attacker)).toBe(false)
    // No subvolume of the attacker's tree is left behind in the pool.
    const list = execFileSync('btrfs', ['subvolume', 'list', t.runtime.pool.root], { encoding: 'utf8' })
    expect(list).not.toContain(attackerId)
  })
})

describe('workspace deletion on the dir driver', () => {
  it("never follows a directory swapped for a link to another tenant's tree while the tree is removed", async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-dirpool-'))
    const pool = new DirPool({
      storePath: path.join(dataDir, 'store'),
      mountPoint: path.join(dataDir, 'mnt'),
      sandboxUid: 61000,
      sandboxGid: 61000,
    })
    await pool.open()
    try {
      const victim = pool.workspacePath(sessionId('victim'))
      const attackerId = sessionId('attacker')
      const attacker = pool.workspacePath(attackerId)
      const count = 20_000
      await mkdir(victim, { recursive: true })
      await mkdir(path.join(attacker, 'd'), { recursive: true })
      execFileSync('python3', [
        '-c',
        `import os\nfor i in range(${count}):\n    open(os.path.join('${victim}', 'f%d' % i), 'w').close()\n    open(os.path.join('${attacker}', 'd', 'f%d' % i), 'w').close()`,
      ])
      const { deleted, output } = await deleteWhileSwapping(
        () => pool.deleteWorkspace(attackerId),
        [path.join(attacker, 'd'), victim, String(count)],
      )
      expect(output).toContain('swapped')
      expect(readdirSync(victim).length).toBe(count)
      expect(deleted).toBeUndefined()
      expect(existsSync(attacker)).toBe(false)
    } finally {
      await pool.close()
      await rm(dataDir, { recursive: true, force: true })
    }
  })
})
