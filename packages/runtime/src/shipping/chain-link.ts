import { CairnProblem } from '@cairn/protocol'
import { type Static, Type } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'

/** A part of a shipped stream is at most this large (the uploader cuts streams smaller). */
export const MAX_PART_BYTES = 512 * 1024 * 1024
/** A chain link or tree manifest larger than this is refused before it is parsed. */
export const MAX_MANIFEST_BYTES = 4 * 1024 * 1024

const Sha256Hex = Type.String({ pattern: '^[0-9a-f]{64}$' })
const PoolId = Type.String({ pattern: '^[a-z]+_[0-9a-z]+$', maxLength: 64 })

const StreamPart = Type.Object(
  {
    key: Type.String({ minLength: 1, maxLength: 1024 }),
    bytes: Type.Integer({ minimum: 1, maximum: MAX_PART_BYTES }),
    sha256: Sha256Hex,
  },
  { additionalProperties: false },
)

/** A stream cut into part objects (each written once); its bytes are the parts' in order. */
const ShippedStream = Type.Object(
  {
    format: Type.Union([Type.Literal('btrfs-send'), Type.Literal('tar')]),
    bytes: Type.Integer({ minimum: 0 }),
    sha256: Sha256Hex,
    parts: Type.Array(StreamPart, { maxItems: 100_000 }),
  },
  { additionalProperties: false },
)
export type ShippedStream = Static<typeof ShippedStream>

/**
 * One link of a session's chain, version 1: written last, once, at
 * `sessions/<sessionId>/chain/<seq>.json`, after every part of its stream was confirmed. A `full`
 * link stands alone; an `increment` applies on top of the link before it (`parentSnapshotId`),
 * back to the full at `baseSeq`.
 */
export const ChainLinkV1 = Type.Object(
  {
    format: Type.Literal('cairn.chain-link'),
    version: Type.Literal(1),
    sessionId: PoolId,
    seq: Type.Integer({ minimum: 1 }),
    baseSeq: Type.Integer({ minimum: 1 }),
    kind: Type.Union([Type.Literal('full'), Type.Literal('increment')]),
    driver: Type.Union([Type.Literal('btrfs'), Type.Literal('dir')]),
    snapshotId: PoolId,
    parentSnapshotId: Type.Optional(PoolId),
    /** The workspace generation marker the snapshot carries. */
    generation: Type.Integer({ minimum: 0 }),
    /** `treeDigest` of the snapshot, checked after a restore. */
    treeDigest: Type.String({ pattern: '^sha256:[0-9a-f]{64}$' }),
    stream: ShippedStream,
    shippedAt: Type.String({ pattern: '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$', maxLength: 40 }),
  },
  { additionalProperties: false },
)
export type ChainLink = Static<typeof ChainLinkV1>

/** A revision, image or dependency environment, shipped once at `trees/<kind>/<id>.json`, version 1. */
export const TreeManifestV1 = Type.Object(
  {
    format: Type.Literal('cairn.tree'),
    version: Type.Literal(1),
    kind: Type.Union([Type.Literal('revision'), Type.Literal('image'), Type.Literal('environment')]),
    id: Type.String({ pattern: '^[a-z]+[_-][0-9a-z]+$', maxLength: 80 }),
    treeDigest: Type.String({ pattern: '^sha256:[0-9a-f]{64}$' }),
    stream: ShippedStream,
    shippedAt: Type.String({ pattern: '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$', maxLength: 40 }),
  },
  { additionalProperties: false },
)
export type TreeManifest = Static<typeof TreeManifestV1>
export type TreeKind = TreeManifest['kind']

const SEQ_DIGITS = 10

export function chainPrefix(sessionId: string): string {
  return `sessions/${sessionId}/chain/`
}

export function chainKey(sessionId: string, seq: number): string {
  return `${chainPrefix(sessionId)}${String(seq).padStart(SEQ_DIGITS, '0')}.json`
}

/** The sequence number a chain key names (undefined: not a chain link's key). */
export function seqOfKey(sessionId: string, key: string): number | undefined {
  const match = new RegExp(`^${chainPrefix(sessionId)}(\\d{${SEQ_DIGITS}})\\.json$`).exec(key)
  return match?.[1] ? Number(match[1]) : undefined
}

/** Where one attempt at shipping link `seq` puts its parts (a fresh attempt never meets an old one's). */
export function streamPrefix(sessionId: string, seq: number, attempt: string): string {
  return `sessions/${sessionId}/streams/${String(seq).padStart(SEQ_DIGITS, '0')}-${attempt}/`
}

export function treeKey(kind: TreeKind, id: string): string {
  return `trees/${kind}/${id}.json`
}

export function treePartsPrefix(kind: TreeKind, id: string, attempt: string): string {
  return `trees/${kind}/${id}/${attempt}/`
}

function invalid(subject: string, why: string): CairnProblem {
  return new CairnProblem('chain_invalid', `${subject} is not a valid shipped manifest: ${why}`)
}

function parseJson(bytes: Buffer, subject: string): unknown {
  try {
    return JSON.parse(bytes.toString('utf8'))
  } catch {
    throw invalid(subject, 'not JSON')
  }
}

function checkStream(stream: ShippedStream, partsUnder: string, subject: string): void {
  let total = 0
  for (const part of stream.parts) {
    if (!part.key.startsWith(partsUnder) || part.key.includes('..'))
      throw invalid(subject, `part ${part.key} is outside ${partsUnder}`)
    total += part.bytes
  }
  if (total !== stream.bytes) throw invalid(subject, `its parts hold ${total} bytes, not ${stream.bytes}`)
}

/**
 * Parses a chain link read from the bucket (untrusted): the schema of its version, then what the
 * schema cannot say (it is the link asked for, its kind and parent agree, its parts add up and
 * lie under this session's streams).
 */
export function parseChainLink(bytes: Buffer, sessionId: string, seq: number): ChainLink {
  const subject = `chain link ${seq} of session ${sessionId}`
  const value = parseJson(bytes, subject)
  const version = (value as { version?: unknown } | null)?.version
  if (version !== 1) throw invalid(subject, `unknown version ${JSON.stringify(version)}`)
  if (!Value.Check(ChainLinkV1, value)) {
    const first = Value.Errors(ChainLinkV1, value).First()
    throw invalid(subject, first ? `${first.path || '/'}: ${first.message}` : 'schema')
  }
  if (value.sessionId !== sessionId) throw invalid(subject, `it names session ${value.sessionId}`)
  if (value.seq !== seq) throw invalid(subject, `it says it is link ${value.seq}`)
  if (value.kind === 'full' && (value.baseSeq !== seq || value.parentSnapshotId !== undefined))
    throw invalid(subject, 'a full link has no parent and is its own base')
  if (value.kind === 'increment' && (value.baseSeq >= seq || value.parentSnapshotId === undefined))
    throw invalid(subject, 'an increment needs a parent and an earlier base')
  if (value.driver === 'btrfs' && value.stream.format !== 'btrfs-send')
    throw invalid(subject, 'a btrfs link carries a btrfs send stream')
  if (value.driver === 'dir' && (value.stream.format !== 'tar' || value.kind !== 'full'))
    throw invalid(subject, 'a dir link is a full tar stream')
  checkStream(value.stream, `sessions/${sessionId}/streams/`, subject)
  return value
}

/** Parses a tree manifest read from the bucket (untrusted). */
export function parseTreeManifest(bytes: Buffer, kind: TreeKind, id: string): TreeManifest {
  const subject = `the manifest of ${kind} ${id}`
  const value = parseJson(bytes, subject)
  const version = (value as { version?: unknown } | null)?.version
  if (version !== 1) throw invalid(subject, `unknown version ${JSON.stringify(version)}`)
  if (!Value.Check(TreeManifestV1, value)) {
    const first = Value.Errors(TreeManifestV1, value).First()
    throw invalid(subject, first ? `${first.path || '/'}: ${first.message}` : 'schema')
  }
  if (value.kind !== kind || value.id !== id) throw invalid(subject, `it names ${value.kind} ${value.id}`)
  if (value.stream.format !== 'tar') throw invalid(subject, 'a tree is a tar stream')
  checkStream(value.stream, `trees/${kind}/${id}/`, subject)
  return value
}
