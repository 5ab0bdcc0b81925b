import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { mkdir, rename } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { treeDigest } from '../workspace-io/digest.js'
import type { ShippingBucket } from './bucket.js'
import {
  MAX_MANIFEST_BYTES,
  parseTreeManifest,
  type TreeKind,
  type TreeManifest,
  treeKey,
  treePartsPrefix,
} from './chain-link.js'
import { feedParts, type PartObserver, shipToolOutput } from './stream-parts.js'
import { removeReceived, tarCreate, tarExtract } from './tree-streams.js'

const TREE_ID = /^[a-z]+[_-][0-9a-z]+$/

export function checkTreeId(kind: TreeKind, id: string): void {
  if (!TREE_ID.test(id) || id.length > 80)
    throw new CairnProblem('bad_request', `invalid ${kind} identifier '${id}'`)
}

/**
 * Ships a tree that never changes (a revision, an image, a dependency environment) once, as a
 * tar stream: skipped when its manifest is already in the bucket (whoever wrote it first wins;
 * trees of one ID are the same tree). Resolves to whether this call wrote it.
 */
export async function shipTree(
  bucket: ShippingBucket,
  kind: TreeKind,
  id: string,
  dir: string,
  partBytes: number,
  onPart?: PartObserver,
): Promise<{ shipped: boolean; manifest?: TreeManifest }> {
  checkTreeId(kind, id)
  if (await bucket.head(treeKey(kind, id))) return { shipped: false }
  const digest = await treeDigest(dir)
  const under = treePartsPrefix(kind, id, randomBytes(6).toString('hex'))
  const stream = await shipToolOutput(bucket, under, tarCreate(dir), 'tar', partBytes, onPart)
  const manifest: TreeManifest = {
    format: 'cairn.tree',
    version: 1,
    kind,
    id,
    treeDigest: digest,
    stream,
    shippedAt: new Date().toISOString(),
  }
  const outcome = await bucket
    .putOnce(treeKey(kind, id), Buffer.from(JSON.stringify(manifest)), 'application/json')
    .catch((error: unknown) => {
      // Another node shipped the same tree meanwhile: its manifest stands (the same tree by ID).
      if (error instanceof CairnProblem && error.code === 'shipping_conflict') return 'exists' as const
      throw error
    })
  return { shipped: outcome === 'written', manifest }
}

/**
 * Unpacks a shipped tree into the empty directory `dir` and checks it against the digest recorded
 * at ship time (`chain_invalid` otherwise; the caller discards `dir`).
 */
export async function receiveTree(
  bucket: ShippingBucket,
  kind: TreeKind,
  id: string,
  dir: string,
): Promise<void> {
  checkTreeId(kind, id)
  const bytes = await bucket.get(treeKey(kind, id), MAX_MANIFEST_BYTES)
  if (!bytes) throw new CairnProblem('not_found', `${kind} ${id} was not shipped to the bucket`)
  const manifest = parseTreeManifest(bytes, kind, id)
  await feedParts(bucket, manifest.stream, tarExtract(dir))
  const digest = await treeDigest(dir)
  if (digest !== manifest.treeDigest)
    throw new CairnProblem(
      'chain_invalid',
      `${kind} ${id} digests ${digest}, not ${manifest.treeDigest} as shipped`,
    )
}

/**
 * Fetches a shipped tree to `target` (which must not exist), as a plain directory: unpacked beside
 * it in a hidden directory, checked, then renamed into place.
 */
export async function fetchTree(
  bucket: ShippingBucket,
  kind: TreeKind,
  id: string,
  target: string,
): Promise<void> {
  if (existsSync(target)) throw new CairnProblem('conflict', `${target} already exists`)
  const holder = path.join(path.dirname(target), `.fetch-${path.basename(target)}`)
  await removeReceived(holder)
  await mkdir(holder, { recursive: true, mode: 0o700 })
  try {
    const tree = path.join(holder, 'tree')
    await mkdir(tree)
    await receiveTree(bucket, kind, id, tree)
    await rename(tree, target)
  } finally {
    await removeReceived(holder)
  }
}
