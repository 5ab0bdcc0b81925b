import { randomBytes } from 'node:crypto'
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { CreateBucketCommand, GetObjectCommand, PutObjectCommand } from '@aws-sdk/client-s3'
import {
  BtrfsPool,
  type ChainLink,
  execTool,
  restoreFromBucket,
  ShippingBucket,
  type StoragePool,
  WorkspaceShipper,
} from '../packages/runtime/dist/index.js'
import { startObjectStore } from '../test/helpers/rgw.js'
import { type Bench, progress, timedResult } from './lib/bench.js'
import type { Target } from './lib/results.js'
import { type Row, row } from './lib/stats.js'

const MiB = 1024 * 1024
const SIZES_MB = [1, 10, 47] as const
/** Turns shipped as increments per size (each changes one 64 KiB file and a note). */
const TURNS = 8
const RESTORE_RUNS = 5
const FULL_RUNS = 3
const SANDBOX_UID = 61000

/**
 * Workspace shipping against Ceph RGW (started by the bench, test/object-store/rgw.sh) on two
 * loop-backed btrfs pools: per workspace size, a full ship (`btrfs send` to the bucket, tree
 * digest and chain link included), the lag of each turn's increment (enqueue to the link
 * confirmed), and a restore into the other pool (full + increments received, digest-checked,
 * made the workspace). Floors from the same run: a raw S3 PUT / GET of the same bytes, and
 * `btrfs send | btrfs receive` of the same chain between the two pools.
 */
export const shipping: Bench = {
  name: 'shipping',
  description: 'ship a workspace to Ceph RGW (full, per-turn increments) and restore it, 1 / 10 / 47 MB',
  run: () =>
    timedResult('shipping', async () => {
      progress('starting Ceph RGW (about 20 s)')
      const store = await startObjectStore()
      const dir = await mkdtemp(path.join(tmpdir(), 'cairn-bench-ship-'))
      const pools: BtrfsPool[] = []
      const openPool = async (name: string) => {
        const pool = new BtrfsPool({
          mountPoint: path.join(dir, name, 'mnt'),
          imagePath: path.join(dir, name, 'pool.img'),
          imageSizeBytes: 2048 * MiB,
          sandboxUid: SANDBOX_UID,
          sandboxGid: SANDBOX_UID,
        })
        await pool.open()
        pools.push(pool)
        return pool
      }
      try {
        const client = store.client()
        await client.send(new CreateBucketCommand({ Bucket: 'cairn-bench' }))
        const bucket = new ShippingBucket(client, 'cairn-bench')
        const source = await openPool('source')
        const target = await openPool('target')
        const rows: Row[] = []
        const notes: string[] = []
        const targets: Target[] = []
        for (const sizeMb of SIZES_MB) {
          progress(`${sizeMb} MB workspace`)
          const figures = await measureSize(sizeMb, source, target, bucket, client)
          rows.push(...figures.rows)
          notes.push(figures.note)
          if (sizeMb === 47)
            targets.push({
              name: 'restore of a 47 MB workspace from the bucket',
              goal: 'median < 2000 ms (issue 19: "about 1–2 s is the first estimate to beat")',
              value: figures.restoreMedianMs,
              met: figures.restoreMedianMs < 2000,
            })
        }
        return {
          config: { sizesMb: SIZES_MB, turns: TURNS, restoreRuns: RESTORE_RUNS, partBytes: 64 * MiB },
          rows,
          targets,
          notes,
        }
      } finally {
        for (const pool of pools) await pool.close().catch(() => undefined)
        await rm(dir, { recursive: true, force: true })
        await store.stop()
      }
    }),
}

let counter = 0
const id = (prefix: string) => `${prefix}_bench${process.pid.toString(36)}x${(++counter).toString(36)}`

/** A workspace of `sizeMb` MB of random data in 1 MiB files (random: compression would not help). */
async function workspaceOf(pool: StoragePool, sizeMb: number): Promise<string> {
  const revisionId = id('rev')
  const staging = await pool.createStaging(id('build'))
  await writeFile(path.join(staging, 'README.md'), '# bench\n')
  await pool.sealRevision(staging, revisionId)
  const sessionId = id('ses')
  const workspace = await pool.createWorkspace(sessionId, revisionId)
  await mkdir(path.join(workspace, 'data'))
  for (let i = 0; i < sizeMb; i++) await writeFile(path.join(workspace, 'data', `${i}.bin`), randomBytes(MiB))
  return sessionId
}

async function snapshotTurn(pool: StoragePool, sessionId: string, generation: number): Promise<string> {
  const workspace = pool.workspacePath(sessionId)
  await writeFile(path.join(workspace, `turn-${generation % 4}.bin`), randomBytes(64 * 1024))
  await writeFile(path.join(workspace, 'notes.txt'), `turn ${generation}\n`)
  await pool.writeGeneration(sessionId, generation)
  const snapshotId = id('snap')
  await pool.snapshotWorkspace(sessionId, snapshotId)
  return snapshotId
}

async function measureSize(
  sizeMb: number,
  source: BtrfsPool,
  target: BtrfsPool,
  bucket: ShippingBucket,
  client: ReturnType<Awaited<ReturnType<typeof startObjectStore>>['client']>,
): Promise<{ rows: Row[]; note: string; restoreMedianMs: number }> {
  // Full ships: a shipper that makes every link full, on a session of its own.
  const fullSession = await workspaceOf(source, sizeMb)
  const fullShipper = new WorkspaceShipper({ pool: source, bucket, fullEvery: 1 })
  const fullMs: number[] = []
  for (let i = 1; i <= FULL_RUNS; i++) {
    const snap = await snapshotTurn(source, fullSession, i)
    const t0 = performance.now()
    fullShipper.enqueue(fullSession, snap)
    await fullShipper.flush(fullSession)
    fullMs.push(performance.now() - t0)
  }
  const fullHead = (await fullShipper.shippedHead(fullSession)) as ChainLink
  await fullShipper.close()

  // Per-turn lag: a full first (untimed), then one increment per turn, enqueue to confirmed.
  const session = await workspaceOf(source, sizeMb)
  const shipper = new WorkspaceShipper({ pool: source, bucket })
  const snaps: string[] = [await snapshotTurn(source, session, 1)]
  shipper.enqueue(session, snaps[0] as string)
  await shipper.flush(session)
  const lagMs: number[] = []
  for (let generation = 2; generation <= TURNS + 1; generation++) {
    const snap = await snapshotTurn(source, session, generation)
    snaps.push(snap)
    const t0 = performance.now()
    shipper.enqueue(session, snap)
    await shipper.flush(session)
    lagMs.push(performance.now() - t0)
  }
  const head = (await shipper.shippedHead(session)) as ChainLink
  await shipper.close()
  const incrementBytes = head.stream.bytes

  // Floors: the same bytes as one raw S3 object, put and got.
  const putMs: number[] = []
  const putIncrementMs: number[] = []
  const getMs: number[] = []
  const fullBytes = randomBytes(fullHead.stream.bytes)
  const incrementBody = randomBytes(incrementBytes)
  for (let i = 0; i < FULL_RUNS; i++) {
    const key = `raw/${sizeMb}/${i}`
    let t0 = performance.now()
    await client.send(new PutObjectCommand({ Bucket: bucket.name, Key: key, Body: fullBytes }))
    putMs.push(performance.now() - t0)
    t0 = performance.now()
    const got = await client.send(new GetObjectCommand({ Bucket: bucket.name, Key: key }))
    await got.Body?.transformToByteArray()
    getMs.push(performance.now() - t0)
  }
  for (let i = 0; i < TURNS; i++) {
    const t0 = performance.now()
    await client.send(
      new PutObjectCommand({ Bucket: bucket.name, Key: `raw/${sizeMb}/inc-${i}`, Body: incrementBody }),
    )
    putIncrementMs.push(performance.now() - t0)
  }

  // Restores into the other pool: workspace and snapshot removed (untimed) between runs.
  const restoreMs: number[] = []
  let streamBytes = 0
  for (let i = 0; i < RESTORE_RUNS; i++) {
    await execTool('sync', [])
    const t0 = performance.now()
    const restored = await restoreFromBucket(bucket, session, target)
    restoreMs.push(performance.now() - t0)
    streamBytes = restored.streamBytes
    await target.deleteWorkspace(session)
    await target.deleteSnapshot(restored.snapshotId)
  }

  // Floor: the same chain sent and received between the pools, no bucket, no digest.
  const localMs: number[] = []
  for (let i = 0; i < RESTORE_RUNS; i++) {
    const into = path.join(target.areaDir('staging'), `.bench-${i}`)
    await mkdir(into)
    await execTool('sync', [])
    const t0 = performance.now()
    let parent: string | undefined
    for (const snap of snaps) {
      const from = source.snapshotPath(snap)
      const args = parent ? `-p ${parent} ` : ''
      await execTool('sh', ['-c', `btrfs send -q ${args}${from} | btrfs receive -q ${into}`], {
        timeoutMs: 300_000,
      })
      parent = from
    }
    localMs.push(performance.now() - t0)
    for (const snap of snaps) await execTool('btrfs', ['subvolume', 'delete', path.join(into, snap)])
    await rm(into, { recursive: true, force: true })
  }

  const median = (values: number[]) =>
    [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] as number
  const rows = [
    row(`${sizeMb} MB: full ship (send, digest, put, link)`, fullMs, {
      name: 'S3 PUT of the same bytes',
      median: median(putMs),
    }),
    row(`${sizeMb} MB: ship lag per turn (64 KiB changed)`, lagMs, {
      name: 'S3 PUT of the same bytes',
      median: median(putIncrementMs),
    }),
    row(`${sizeMb} MB: restore (full + ${TURNS} increments)`, restoreMs, {
      name: 'btrfs send → receive, same chain',
      median: median(localMs),
    }),
    row(`${sizeMb} MB: S3 GET of the full stream's bytes`, getMs),
  ]
  const note = `${sizeMb} MB: full stream ${(fullHead.stream.bytes / MiB).toFixed(1)} MiB, an increment ${(incrementBytes / 1024).toFixed(0)} KiB, a restore reads ${(streamBytes / MiB).toFixed(1)} MiB`
  return { rows, note, restoreMedianMs: median(restoreMs) }
}
