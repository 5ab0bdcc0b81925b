import { CairnProblem } from '@cairn/protocol'
import type { ShippingBucket } from './bucket.js'
import {
  type ChainLink,
  chainKey,
  chainPrefix,
  MAX_MANIFEST_BYTES,
  parseChainLink,
  seqOfKey,
} from './chain-link.js'

/** The newest confirmed link of a session's chain (undefined: nothing shipped). */
export async function readChainHead(
  bucket: ShippingBucket,
  sessionId: string,
): Promise<ChainLink | undefined> {
  const seqs = (await bucket.list(chainPrefix(sessionId)))
    .map((key) => seqOfKey(sessionId, key))
    .filter((seq): seq is number => seq !== undefined)
  if (seqs.length === 0) return undefined
  return readLink(bucket, sessionId, Math.max(...seqs))
}

export async function readLink(bucket: ShippingBucket, sessionId: string, seq: number): Promise<ChainLink> {
  const bytes = await bucket.get(chainKey(sessionId, seq), MAX_MANIFEST_BYTES)
  if (!bytes)
    throw new CairnProblem(
      'chain_invalid',
      `chain link ${seq} of session ${sessionId} is missing from the bucket`,
    )
  return parseChainLink(bytes, sessionId, seq)
}

/**
 * What a restore applies, in order: the head link's full and every increment after it up to the
 * head. The head is link `headSeq` when given (the one the session's owner recorded; links after
 * it are not read, and a missing one is `chain_invalid`), else the newest in the bucket. Each
 * increment must name the link before it as its parent and share its base, so a chain spliced
 * from two lineages is refused (`chain_invalid`) before a byte is received.
 */
export async function readChain(
  bucket: ShippingBucket,
  sessionId: string,
  headSeq?: number,
): Promise<ChainLink[] | undefined> {
  const head =
    headSeq === undefined
      ? await readChainHead(bucket, sessionId)
      : await readLink(bucket, sessionId, headSeq)
  if (!head) return undefined
  const earlier = Array.from({ length: head.seq - head.baseSeq }, (_, i) => head.baseSeq + i)
  const links = [...(await Promise.all(earlier.map((seq) => readLink(bucket, sessionId, seq)))), head]
  const [base] = links
  if (base?.kind !== 'full' || base.seq !== head.baseSeq)
    throw new CairnProblem(
      'chain_invalid',
      `link ${head.baseSeq} of session ${sessionId} is not a full stream`,
    )
  for (let i = 1; i < links.length; i++) {
    const link = links[i] as ChainLink
    const before = links[i - 1] as ChainLink
    if (
      link.kind !== 'increment' ||
      link.baseSeq !== head.baseSeq ||
      link.parentSnapshotId !== before.snapshotId ||
      link.driver !== before.driver ||
      link.generation < before.generation
    )
      throw new CairnProblem(
        'chain_invalid',
        `link ${link.seq} of session ${sessionId} does not follow link ${before.seq} (parent, base, driver or generation)`,
      )
  }
  return links
}
