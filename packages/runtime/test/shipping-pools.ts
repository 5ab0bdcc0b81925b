import { randomBytes } from 'node:crypto'
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { CreateBucketCommand } from '@aws-sdk/client-s3'
import type { TestObjectStore } from '../../../test/helpers/rgw.js'
import { ShippingBucket } from '../src/shipping/bucket.js'
import { BtrfsPool } from '../src/storage/btrfs-pool.js'
import { DirPool } from '../src/storage/dir-pool.js'
import type { StoragePool } from '../src/storage/pool.js'
import { SANDBOX_UID } from './harness.js'

/** Pools for the shipping tests: real loop-backed btrfs images (or dir stores) under one temp dir. */
export class ShippingPools {
  private readonly pools: StoragePool[] = []
  private constructor(readonly root: string) {}

  static async create(): Promise<ShippingPools> {
    return new ShippingPools(await mkdtemp(path.join(tmpdir(), 'cairn-ship-')))
  }

  async btrfs(name: string, sizeBytes = 768 * 1024 * 1024): Promise<BtrfsPool> {
    const pool = new BtrfsPool({
      mountPoint: path.join(this.root, name, 'mnt'),
      imagePath: path.join(this.root, name, 'pool.img'),
      imageSizeBytes: sizeBytes,
      sandboxUid: SANDBOX_UID,
      sandboxGid: SANDBOX_UID,
    })
    await pool.open()
    this.pools.push(pool)
    return pool
  }

  async dir(name: string): Promise<DirPool> {
    const pool = new DirPool({
      mountPoint: path.join(this.root, name, 'mnt'),
      storePath: path.join(this.root, name, 'store'),
      sandboxUid: SANDBOX_UID,
      sandboxGid: SANDBOX_UID,
    })
    await pool.open()
    this.pools.push(pool)
    return pool
  }

  async close(): Promise<void> {
    for (const pool of this.pools.splice(0)) await pool.close().catch(() => undefined)
    await rm(this.root, { recursive: true, force: true })
  }
}

let revisionCount = 0

/** A sealed revision holding a couple of files. */
export async function newRevision(pool: StoragePool): Promise<string> {
  const revisionId = `rev_ship${process.pid.toString(36)}x${(++revisionCount).toString(36)}`
  const staging = await pool.createStaging(`build_${revisionId.slice(4)}`)
  await writeFile(path.join(staging, 'README.md'), '# shipped project\n')
  await mkdir(path.join(staging, 'src'))
  await writeFile(path.join(staging, 'src', 'main.py'), 'print("hello")\n')
  await pool.sealRevision(staging, revisionId)
  return revisionId
}

/** A new session workspace on a new revision. */
export async function newWorkspace(pool: StoragePool, sessionId: string): Promise<string> {
  return pool.createWorkspace(sessionId, await newRevision(pool))
}

/**
 * One "turn": writes `bytes` of fresh random data to `file` in the workspace (plus a small note),
 * moves the generation marker forward, and takes a read-only snapshot, as an automatic snapshot
 * after a turn does.
 */
export async function turn(
  pool: StoragePool,
  sessionId: string,
  generation: number,
  changes: { file: string; bytes: number },
): Promise<string> {
  const workspace = pool.workspacePath(sessionId)
  await mkdir(path.dirname(path.join(workspace, changes.file)), { recursive: true })
  await writeFile(path.join(workspace, changes.file), randomBytes(changes.bytes))
  await writeFile(path.join(workspace, 'notes.txt'), `turn ${generation}\n`)
  await pool.writeGeneration(sessionId, generation)
  const snapshotId = `snap_ship${process.pid.toString(36)}g${generation}x${randomBytes(3).toString('hex')}`
  await pool.snapshotWorkspace(sessionId, snapshotId)
  return snapshotId
}

export async function openBucket(store: TestObjectStore, name: string): Promise<ShippingBucket> {
  const client = store.client()
  await client.send(new CreateBucketCommand({ Bucket: name }))
  return new ShippingBucket(client, name)
}
