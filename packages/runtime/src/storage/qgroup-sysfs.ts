import { existsSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { TreeSizes } from './pool.js'

/**
 * One quota group's figures as the kernel keeps them, read from sysfs
 * (`/sys/fs/btrfs/<fsid>/qgroups/<level>_<id>/referenced` and `exclusive`, Linux 5.9+): two small
 * reads for one group, whatever the number of groups in the pool. `btrfs qgroup show` lists every
 * group and looks up each subvolume's path (two ioctls a group, one group a workspace and a
 * snapshot): a tenant's storage reservation read it on every turn-events batch, so with thousands
 * of warm sessions the listings took half the CPU of the server's process tree while warming.
 * The figures are the kernel's in memory, which the quota tree `btrfs qgroup show` reads is
 * written from at each transaction commit: as fresh as the listing's, or fresher.
 */
export class QgroupSysfs {
  private constructor(private readonly dir: string) {}

  /** The reader for the filesystem whose sysfs directory is `fsDir`; undefined: no qgroups there (quotas off, or a kernel before 5.9). */
  static at(fsDir: string): QgroupSysfs | undefined {
    const dir = path.join(fsDir, 'qgroups')
    return existsSync(path.join(dir, 'enabled')) ? new QgroupSysfs(dir) : undefined
  }

  /** The figures of `group` (`level/id`); undefined: no such group (never made, or deleted). */
  figures(group: string): TreeSizes | undefined {
    const groupDir = path.join(this.dir, group.replace('/', '_'))
    // Synchronous: two sysfs reads of a few bytes each, microseconds, no disk behind them.
    try {
      return {
        referencedBytes: readBytes(path.join(groupDir, 'referenced')),
        exclusiveBytes: readBytes(path.join(groupDir, 'exclusive')),
      }
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
      throw new CairnProblem(
        'storage_error',
        `reading the figures of quota group ${group} failed: ${(error as Error).message}`,
      )
    }
  }

  /** Whether the kernel marked the figures inconsistent (a rescan is needed, or running). */
  inconsistent(): boolean {
    return readFileSync(path.join(this.dir, 'inconsistent'), 'utf8').trim() !== '0'
  }
}

function readBytes(file: string): number {
  const text = readFileSync(file, 'latin1').trim()
  if (!/^\d+$/.test(text)) throw new Error(`${file} holds ${JSON.stringify(text)}, not a byte count`)
  return Number(text)
}
