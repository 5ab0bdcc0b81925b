import { readdirSync } from 'node:fs'
import { unlink } from 'node:fs/promises'
import path from 'node:path'
import type { CairnProblem } from '@cairn/protocol'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startObjectStore, type TestObjectStore } from '../../../../test/helpers/rgw.js'
import { startTcpProxy } from '../../../../test/helpers/tcp-proxy.js'
import { sessionId } from '../../test/harness.js'
import { rejection, within } from '../../test/settled.js'
import { newRevision, newWorkspace, openBucket, ShippingPools, turn } from '../../test/shipping-pools.js'
import type { BtrfsPool } from '../storage/btrfs-pool.js'
import type { StoragePool } from '../storage/pool.js'
import { treeDigest } from '../workspace-io/digest.js'
import type { ShippingBucket } from './bucket.js'
import { bucketCallBoundMs } from './bucket-bounds.js'
import { createShippingBucket } from './bucket-config.js'
import { type ChainLink, chainKey, chainPrefix } from './chain-link.js'
import { readChain } from './chain-reader.js'
import { restoreFromBucket } from './restore.js'
import { type ShippingObserver, WorkspaceShipper } from './workspace-shipper.js'

const MiB = 1024 * 1024

let store: TestObjectStore
let pools: ShippingPools
let source: BtrfsPool
let bucket: ShippingBucket

beforeAll(async () => {
  // The pools first: if the object store fails to come up, afterAll still removes their directory.
  pools = await ShippingPools.create()
  store = await startObjectStore()
  source = await pools.btrfs('source')
  bucket = await openBucket(store, 'cairn-shipping')
}, 600_000)

afterAll(async () => {
  await pools?.close()
  await store?.stop()
})

/** A fresh pool to restore into, as another machine's would be. */
async function freshPool(name: string): Promise<BtrfsPool> {
  return pools.btrfs(name)
}

function stagingLeftovers(pool: StoragePool): string[] {
  return readdirSync(pool.areaDir('staging'))
}

describe('WorkspaceShipper (btrfs pools, Ceph RGW)', () => {
  it('ships three turns as a full stream and two increments; a fresh pool restores them byte-identical', async () => {
    const id = sessionId('ship')
    await newWorkspace(source, id)
    const shipper = new WorkspaceShipper({ pool: source, bucket, partBytes: 1 * MiB })
    try {
      expect(await shipper.shippedGeneration(id)).toBeUndefined()
      const snaps: string[] = []
      snaps.push(await turn(source, id, 1, { file: 'data/a.bin', bytes: 3 * MiB }))
      shipper.enqueue(id, snaps[0] as string)
      await shipper.flush(id)
      snaps.push(await turn(source, id, 2, { file: 'data/b.bin', bytes: 200 * 1024 }))
      shipper.enqueue(id, snaps[1] as string)
      await shipper.flush(id)
      await unlink(path.join(source.workspacePath(id), 'README.md'))
      snaps.push(await turn(source, id, 3, { file: 'data/a.bin', bytes: 100 * 1024 }))
      shipper.enqueue(id, snaps[2] as string)
      await shipper.flush(id)

      expect(await shipper.shippedGeneration(id)).toBe(3)
      expect(shipper.lag(id)).toEqual({ unshippedSnapshots: 0, secondsBehind: 0, failingSessions: 0 })
      const chain = (await readChain(bucket, id)) as ChainLink[]
      expect(chain.map((link) => [link.seq, link.kind, link.snapshotId, link.generation])).toEqual([
        [1, 'full', snaps[0], 1],
        [2, 'increment', snaps[1], 2],
        [3, 'increment', snaps[2], 3],
      ])
      // The first stream holds the 3 MiB file in several 1 MiB parts; the increments only the change.
      const [full, second, third] = chain as [ChainLink, ChainLink, ChainLink]
      expect(full.stream.parts.length).toBeGreaterThanOrEqual(3)
      expect(second.stream.bytes).toBeLessThan(full.stream.bytes / 5)
      expect(third.stream.bytes).toBeLessThan(full.stream.bytes / 5)

      const target = await freshPool('restore-a')
      const restored = await restoreFromBucket(bucket, id, target)
      expect(restored).toMatchObject({ snapshotId: snaps[2], generation: 3, seq: 3 })
      const shippedDigest = await treeDigest(source.snapshotPath(snaps[2] as string))
      expect(restored.treeDigest).toBe(shippedDigest)
      expect(await treeDigest(target.workspacePath(id))).toBe(shippedDigest)
      expect(await target.readGenerations([id])).toEqual([3])
      expect(await target.hasSnapshot(snaps[2] as string)).toBe(true)
      expect(stagingLeftovers(target)).toEqual([])

      // The machine it came back on continues the chain: its next snapshot ships as an increment on
      // the restored one (which kept its received UUID), and a third machine restores all of it.
      const onward = new WorkspaceShipper({ pool: target, bucket })
      try {
        await onward.restoreFromBucket(id)
        const fourth = await turn(target, id, 4, { file: 'data/c.bin', bytes: 150 * 1024 })
        onward.enqueue(id, fourth)
        await onward.flush(id)
        expect(await onward.shippedGeneration(id)).toBe(4)
        const head = (await onward.shippedHead(id)) as ChainLink
        expect([head.seq, head.kind, head.parentSnapshotId]).toEqual([4, 'increment', snaps[2]])
        const third = await freshPool('restore-a2')
        const again = await restoreFromBucket(bucket, id, third)
        expect(again).toMatchObject({ snapshotId: fourth, generation: 4 })
        expect(await treeDigest(third.workspacePath(id))).toBe(await treeDigest(target.snapshotPath(fourth)))
      } finally {
        await onward.close()
      }
    } finally {
      await shipper.close()
    }
  })

  it('bounds the chain: with fullEvery 2 every second link is a full stream, and a restore reads only from the last full', async () => {
    const id = sessionId('bound')
    await newWorkspace(source, id)
    const shipper = new WorkspaceShipper({ pool: source, bucket, fullEvery: 2 })
    try {
      let last = ''
      for (let generation = 1; generation <= 5; generation++) {
        last = await turn(source, id, generation, { file: `f${generation}.bin`, bytes: 64 * 1024 })
        shipper.enqueue(id, last)
        await shipper.flush(id)
      }
      const links = (await bucket.list(chainPrefix(id))).length
      expect(links).toBe(5)
      const chain = (await readChain(bucket, id)) as ChainLink[]
      // Links 1, 3 and 5 are full: the newest chain is link 5 alone.
      expect(chain.map((link) => [link.seq, link.kind])).toEqual([[5, 'full']])
      const target = await freshPool('restore-b')
      const restored = await restoreFromBucket(bucket, id, target)
      expect(restored.streamBytes).toBe(chain[0]?.stream.bytes)
      expect(await treeDigest(target.workspacePath(id))).toBe(await treeDigest(source.snapshotPath(last)))
    } finally {
      await shipper.close()
    }
  })

  it('coalesces snapshots taken while one ships: the newest wins and the lag counts every one until it is confirmed', async () => {
    const id = sessionId('coal')
    await newWorkspace(source, id)
    const shipper = new WorkspaceShipper({ pool: source, bucket })
    try {
      const snaps: string[] = []
      for (let generation = 1; generation <= 4; generation++)
        snaps.push(await turn(source, id, generation, { file: 'x.bin', bytes: 512 * 1024 }))
      // Four turns' snapshots come while the first ships (enqueued back to back, nothing awaited).
      for (const snap of snaps) shipper.enqueue(id, snap)
      expect(shipper.lag(id).unshippedSnapshots).toBe(4)
      await shipper.flush(id)
      const chain = (await readChain(bucket, id)) as ChainLink[]
      // The first was being shipped when the others came; of those only the newest was shipped.
      expect(chain.map((link) => link.snapshotId)).toEqual([snaps[0], snaps[3]])
      expect(shipper.lag(id).unshippedSnapshots).toBe(0)
    } finally {
      await shipper.close()
    }
  })

  it('RGW killed mid-ship: shipping fails and retries, shippedGeneration stays, and it resumes and catches up once RGW is back', async () => {
    const id = sessionId('kill')
    await newWorkspace(source, id)
    const failures: CairnProblem[] = []
    let killAtPart: ((key: string) => void) | undefined
    const observer: ShippingObserver = {
      failed: ({ error }) => failures.push(error),
      partUploaded: ({ key }) => killAtPart?.(key),
    }
    const shipper = new WorkspaceShipper({
      pool: source,
      bucket,
      partBytes: 256 * 1024,
      retryInitialMs: 200,
      retryMaxMs: 1000,
      observer,
    })
    try {
      const first = await turn(source, id, 1, { file: 'a.bin', bytes: 512 * 1024 })
      shipper.enqueue(id, first)
      await shipper.flush(id)
      expect(await shipper.shippedGeneration(id)).toBe(1)

      // Turn 2's stream is several parts: the gateway is killed once its first part is in, before
      // the second is sent (the kill is synchronous).
      let killed = false
      killAtPart = (key) => {
        if (killed || !key.includes('/streams/0000000002-')) return
        killed = true
        store.killGateway()
      }
      const second = await turn(source, id, 2, { file: 'b.bin', bytes: 2 * MiB })
      shipper.enqueue(id, second)
      await waitUntil(() => failures.length >= 2, 60_000)
      expect(killed).toBe(true)
      expect(failures.every((error) => error.code === 'shipping_failed')).toBe(true)
      expect(await shipper.shippedGeneration(id)).toBe(1)
      // Turns go on meanwhile: a third snapshot joins the queue; the lag counts both.
      const third = await turn(source, id, 3, { file: 'c.bin', bytes: 128 * 1024 })
      shipper.enqueue(id, third)
      expect(shipper.lag(id).unshippedSnapshots).toBe(2)
      expect(shipper.lag(id).secondsBehind).toBeGreaterThan(0)

      await store.startGateway()
      await shipper.flush(id)
      expect(await shipper.shippedGeneration(id)).toBe(3)
      expect(shipper.lag(id).unshippedSnapshots).toBe(0)
      // Nothing that did not make it is in the chain: link 2 is the third snapshot, shipped after the
      // outage, on top of link 1; the parts of the cut attempt are referenced by no link.
      const chain = (await readChain(bucket, id)) as ChainLink[]
      expect(chain.map((link) => [link.seq, link.snapshotId, link.generation])).toEqual([
        [1, first, 1],
        [2, third, 3],
      ])
      const referenced = new Set(chain.flatMap((link) => link.stream.parts.map((part) => part.key)))
      const orphans = (await bucket.list(`sessions/${id}/streams/`)).filter((key) => !referenced.has(key))
      expect(orphans.length).toBeGreaterThan(0)
      const target = await freshPool('restore-c')
      await restoreFromBucket(bucket, id, target)
      expect(await treeDigest(target.workspacePath(id))).toBe(await treeDigest(source.snapshotPath(third)))
    } finally {
      await store.startGateway().catch(() => undefined)
      await shipper.close()
    }
  })

  it("never overwrites: a link number another writer took is a shipping_conflict, and that writer's link stays", async () => {
    const id = sessionId('race')
    await newWorkspace(source, id)
    const failures: CairnProblem[] = []
    const shipper = new WorkspaceShipper({
      pool: source,
      bucket,
      retryInitialMs: 50,
      observer: { failed: ({ error }) => failures.push(error) },
    })
    try {
      await shipper.shippedGeneration(id)
      // Another writer takes link 1 after this shipper read the (empty) chain.
      await bucket.putOnce(chainKey(id, 1), Buffer.from('{"written": "by someone else"}'))
      shipper.enqueue(id, await turn(source, id, 1, { file: 'a.bin', bytes: 4096 }))
      await waitUntil(() => failures.length >= 1, 30_000)
      expect(failures[0]?.code).toBe('shipping_conflict')
      expect((await bucket.get(chainKey(id, 1), 1024))?.toString()).toBe('{"written": "by someone else"}')
    } finally {
      await shipper.close()
    }
  })
})

describe('a hung object store (it accepts connections and never answers)', () => {
  it('fails a ship and a restore shipping_failed within the bound, reads failing meanwhile, and catches up once it answers', async () => {
    // The client the product makes (createShippingBucket: its timeouts and attempts), pointed at a
    // proxy in front of RGW that stops forwarding. With no timeouts, both waited for ever.
    const proxy = await startTcpProxy(store.endpoint)
    const idleTimeoutMs = 1_000
    const boundMs = bucketCallBoundMs(idleTimeoutMs)
    const credentials = { AWS_ACCESS_KEY_ID: store.accessKeyId, AWS_SECRET_ACCESS_KEY: store.secretAccessKey }
    Object.assign(process.env, credentials)
    const hungBucket = createShippingBucket({
      bucket: 'cairn-shipping',
      endpoint: proxy.url,
      region: 'default',
      idleTimeoutMs,
    })
    const id = sessionId('hung')
    await newWorkspace(source, id)
    const failures: CairnProblem[] = []
    const shipper = new WorkspaceShipper({
      pool: source,
      bucket: hungBucket,
      retryInitialMs: 200,
      retryMaxMs: 1000,
      observer: { failed: ({ error }) => failures.push(error) },
    })
    try {
      const first = await turn(source, id, 1, { file: 'a.bin', bytes: 64 * 1024 })
      shipper.enqueue(id, first)
      await shipper.flush(id)
      expect(await shipper.shippedGeneration(id)).toBe(1)

      proxy.hang()
      const second = await turn(source, id, 2, { file: 'b.bin', bytes: 64 * 1024 })
      shipper.enqueue(id, second)
      await waitUntil(() => failures.length >= 1, boundMs)
      expect(failures[0]?.code).toBe('shipping_failed')
      expect(shipper.lag(id)).toMatchObject({ unshippedSnapshots: 1, failingSessions: 1 })
      expect(await shipper.shippedGeneration(id)).toBe(1)

      const target = await freshPool('restore-hung')
      const error = await rejection(within(restoreFromBucket(hungBucket, id, target), boundMs))
      expect(error.code).toBe('shipping_failed')
      expect(error.status).toBe(503)
      expect(stagingLeftovers(target)).toEqual([])

      proxy.resume()
      await shipper.flush(id)
      expect(await shipper.shippedGeneration(id)).toBe(2)
      expect(shipper.lag(id)).toEqual({ unshippedSnapshots: 0, secondsBehind: 0, failingSessions: 0 })
      expect((await restoreFromBucket(hungBucket, id, target)).generation).toBe(2)
    } finally {
      proxy.resume()
      await shipper.close()
      await proxy.close()
      for (const name of Object.keys(credentials)) delete process.env[name]
    }
  })
})

describe('trees that never change', () => {
  it('ships a revision once, and another pool fetches it back as a sealed revision sessions can start on', async () => {
    const revisionId = await newRevision(source)
    const shipper = new WorkspaceShipper({ pool: source, bucket })
    const target = await freshPool('trees')
    const fetcher = new WorkspaceShipper({ pool: target, bucket })
    try {
      expect(await shipper.shipTree('revision', revisionId)).toEqual({ shipped: true })
      expect(await shipper.shipTree('revision', revisionId)).toEqual({ shipped: false })
      await fetcher.fetchTree('revision', revisionId)
      expect(await target.hasRevision(revisionId)).toBe(true)
      expect(await treeDigest(target.revisionPath(revisionId))).toBe(
        await treeDigest(source.revisionPath(revisionId)),
      )
      // Sealed as the pool seals its own: a session's workspace is a snapshot of it.
      const id = sessionId('onrev')
      await target.createWorkspace(id, revisionId)
      expect(await target.readGenerations([id])).toEqual([0])
      const again = await rejection(fetcher.fetchTree('revision', revisionId))
      expect(again.code).toBe('conflict')
      expect(stagingLeftovers(target)).toEqual([])
    } finally {
      await shipper.close()
      await fetcher.close()
    }
  })
})

describe('WorkspaceShipper (dir pools)', () => {
  it('ships a full tar stream each time and restores it into a fresh dir pool, byte-identical', async () => {
    const dirSource = await pools.dir('dir-source')
    const id = sessionId('dir')
    await newWorkspace(dirSource, id)
    const shipper = new WorkspaceShipper({ pool: dirSource, bucket })
    try {
      let last = ''
      for (let generation = 1; generation <= 2; generation++) {
        last = await turn(dirSource, id, generation, { file: 'w.bin', bytes: 300 * 1024 })
        shipper.enqueue(id, last)
        await shipper.flush(id)
      }
      const chain = (await readChain(bucket, id)) as ChainLink[]
      expect(chain.map((link) => [link.seq, link.kind, link.stream.format])).toEqual([[2, 'full', 'tar']])
      const target = await pools.dir('dir-target')
      const restored = await restoreFromBucket(bucket, id, target)
      expect(restored.generation).toBe(2)
      expect(await treeDigest(target.workspacePath(id))).toBe(await treeDigest(dirSource.snapshotPath(last)))
      expect(await target.readGenerations([id])).toEqual([2])
      // A dir chain cannot go into a btrfs pool (nor the reverse): typed, before anything is read.
      const error = await rejection(restoreFromBucket(bucket, id, source))
      expect(error.code).toBe('unavailable')
    } finally {
      await shipper.close()
    }
  })
})

async function waitUntil(check: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out waiting')
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}
