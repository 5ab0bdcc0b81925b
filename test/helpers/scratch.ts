import { execFileSync, spawnSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

const made = new Set<string>()

/** A temporary directory removed when the test file ends (see test/setup/cleanup.ts). */
export async function scratchDir(prefix: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), prefix))
  made.add(dir)
  return dir
}

/** Removes every scratch directory made so far in this test file. */
export async function removeScratchDirs(): Promise<void> {
  const dirs = [...made]
  made.clear()
  await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })))
}

/**
 * Unmounts and detaches a loop-backed pool image that a killed server left mounted (a graceful
 * stop does this itself), so a test that kills servers leaves no mount or loop device behind.
 */
export function releasePoolImage(image: string): void {
  let loops: string[] = []
  try {
    loops = execFileSync('losetup', ['-j', image], { encoding: 'utf8' })
      .split('\n')
      .map((line) => line.split(':')[0] ?? '')
      .filter((dev) => dev.startsWith('/dev/loop'))
  } catch {
    return
  }
  const mounts = readFileSync('/proc/self/mounts', 'utf8').split('\n')
  for (const dev of loops) {
    for (const line of mounts) {
      const [source, target] = line.split(' ')
      if (source === dev && target) spawnSync('umount', ['-l', target.replace(/\\040/g, ' ')])
    }
    spawnSync('losetup', ['-d', dev])
  }
}
