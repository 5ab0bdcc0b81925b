import { existsSync } from 'node:fs'
import { mkdir, rename } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { BtrfsOps } from '../storage/btrfs-ops.js'
import { BtrfsPool } from '../storage/btrfs-pool.js'
import { assertInertTree } from '../storage/inert-tree.js'
import type { StoragePool } from '../storage/pool.js'
import { safeName } from '../storage/pool.js'
import { treeDigest } from '../workspace-io/digest.js'
import type { ShippingBucket } from './bucket.js'
import type { ChainLink } from './chain-link.js'
import { readChain } from './chain-reader.js'
import { SendStreamCheck } from './send-stream-check.js'
import { feedParts } from './stream-parts.js'
import { btrfsReceive, removeReceived, tarExtract } from './tree-streams.js'

/** What a restore from the bucket brought back. */
export interface RestoredWorkspace {
  sessionId: string
  /** The snapshot the workspace came back from (now also in the pool's snapshots). */
  snapshotId: string
  /** The workspace generation that snapshot carried (the workspace's marker is set to it). */
  generation: number
  /** The chain link it was (see docs/shipping.md). */
  seq: number
  treeDigest: string
  shippedAt: string
  /** Bytes read from the bucket (every stream of the chain). */
  streamBytes: number
  /** The newest link itself, for whoever continues the chain from here. */
  head: ChainLink
}

/** The chain link a restore must end at: what the session's owner recorded (`sessions.shipped_link_seq`). */
export interface ExpectedHead {
  seq: number
  treeDigest: string
}

/**
 * Brings a session's workspace back from a confirmed chain link: the one `expectedHead` names
 * (what the session's owner recorded under its epoch; links after it, which anyone with the
 * bucket's keys could add, are ignored, and a missing or different one is `chain_invalid`), else
 * the newest. It takes the full stream and
 * every increment after it, received in order into a staging directory of `pool` (never where a
 * tree could be used), the result checked against the digest recorded at ship time, then moved
 * into the pool's snapshots and made the session's workspace (a writable copy, marker set to the
 * shipped generation). Anything the bucket holds that does not check out is `chain_invalid` and
 * leaves nothing behind; a session with nothing shipped is `state_lost`.
 */
export async function restoreFromBucket(
  bucket: ShippingBucket,
  sessionId: string,
  pool: StoragePool,
  options: { tenantId?: string | undefined; expectedHead?: ExpectedHead | undefined } = {},
): Promise<RestoredWorkspace> {
  safeName(sessionId)
  const expected = options.expectedHead
  const links = await readChain(bucket, sessionId, expected?.seq)
  const head = links?.at(-1)
  if (!links || !head)
    throw new CairnProblem('state_lost', `nothing of session ${sessionId} was shipped to the bucket`)
  // The digest the owner recorded, not the one the bucket's link claims.
  const wantDigest = expected?.treeDigest ?? head.treeDigest
  if (head.treeDigest !== wantDigest)
    throw new CairnProblem(
      'chain_invalid',
      `chain link ${head.seq} of session ${sessionId} is not the one its owner recorded (tree digest ${head.treeDigest}, recorded ${wantDigest})`,
    )
  if (head.driver !== pool.driver)
    throw new CairnProblem(
      'unavailable',
      `session ${sessionId} was shipped from a ${head.driver} pool; this pool is ${pool.driver}`,
    )
  const staging = path.join(pool.areaDir('staging'), `.ship-${sessionId}`)
  await removeReceived(staging)
  await mkdir(staging, { mode: 0o700 })
  let streamBytes = 0
  try {
    let parentUuid: string | undefined
    for (const link of links) {
      if (link.driver === 'btrfs') {
        // Each stream must make its own subvolume on the previous link's: receive would otherwise
        // take a parent or clone source anywhere in the pool (another session's snapshot).
        const check = new SendStreamCheck(
          parentUuid === undefined
            ? { kind: 'full', name: link.snapshotId }
            : { kind: 'increment', name: link.snapshotId, parentUuid },
        )
        await feedParts(bucket, link.stream, btrfsReceive(staging), check)
        parentUuid = check.subvolumeUuid
      } else {
        const dir = path.join(staging, link.snapshotId)
        await mkdir(dir)
        await feedParts(bucket, link.stream, tarExtract(dir))
      }
      streamBytes += link.stream.bytes
    }
    const received = path.join(staging, head.snapshotId)
    if (!existsSync(received))
      throw new CairnProblem(
        'chain_invalid',
        `the chain of session ${sessionId} did not make ${head.snapshotId}`,
      )
    const digest = await treeDigest(received)
    if (digest !== wantDigest)
      throw new CairnProblem(
        'chain_invalid',
        `the restored tree of session ${sessionId} digests ${digest}, not ${wantDigest} as shipped`,
      )
    // Whoever wrote the chain (a node, or anyone with the bucket's keys) is not this machine.
    await assertInertTree(received, `the restored tree of session ${sessionId}`)
    await placeSnapshot(pool, { snapshotId: head.snapshotId, tenantId: options.tenantId }, received, digest)
    await pool.restoreWorkspace(sessionId, head.snapshotId, head.generation, options.tenantId)
  } finally {
    await removeReceived(staging)
  }
  return {
    sessionId,
    snapshotId: head.snapshotId,
    generation: head.generation,
    seq: head.seq,
    treeDigest: head.treeDigest,
    shippedAt: head.shippedAt,
    streamBytes,
    head,
  }
}

/**
 * Moves the received tree into the pool's snapshots (a received btrfs subvolume, read-only, is
 * adopted there under the same received UUID instead: it cannot change directories). A snapshot of that ID already there (a
 * node taking back a session it held) is used if it is the same tree, and refused otherwise.
 */
async function placeSnapshot(
  pool: StoragePool,
  { snapshotId, tenantId }: { snapshotId: string; tenantId: string | undefined },
  received: string,
  digest: string,
) {
  const target = pool.snapshotPath(snapshotId)
  if (existsSync(target)) {
    if ((await treeDigest(target)) === digest) return
    throw new CairnProblem(
      'conflict',
      `this pool already holds a different snapshot ${snapshotId}; it is not replaced by the shipped one`,
    )
  }
  if (pool.driver === 'dir') {
    await rename(received, target)
    return
  }
  // In the tenant's group, through the pool's own helper (no process to start); else one for this call.
  if (pool instanceof BtrfsPool) {
    await pool.adoptReceived(received, target, tenantId)
    return
  }
  const ops = new BtrfsOps(1)
  try {
    await ops.adoptReceived(received, target)
  } finally {
    ops.close()
  }
}
