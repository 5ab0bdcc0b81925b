import { lstat } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem, type FileEntry, type WorkspaceDiff } from '@cairn/protocol'
import { parseEntries, pathArg, type ReadOptions, readTree, wireName } from './reader.js'

/** Lists one directory beneath `root` (no recursion, links reported, never followed). */
export async function listDirectory(
  root: string,
  rel: Buffer,
  options: ReadOptions = {},
): Promise<FileEntry[]> {
  const subject = `/workspace/${rel.toString('utf8')}`
  const listed = parseEntries(await readTree(root, ['list', pathArg(rel)], { subject, ...options }))
  const prefix = Buffer.from('/workspace/')
  const out: FileEntry[] = listed.map((entry) => {
    const nameBytes = entry.name
    const pathBytes = Buffer.concat([
      prefix,
      rel,
      rel.length > 0 ? Buffer.from('/') : Buffer.alloc(0),
      nameBytes,
    ])
    const name = wireName(nameBytes)
    const fullPath = wireName(pathBytes)
    const target = entry.type === 'symlink' ? wireName(Buffer.from(entry.target, 'base64')) : undefined
    return {
      name: name.text,
      path: fullPath.text,
      type: entry.type,
      size: entry.size,
      mode: entry.mode,
      modifiedAt: new Date(Number(entry.mtimeNs / 1_000_000n)).toISOString(),
      ...(target ? { target: target.text } : {}),
      ...(name.base64 ? { nameBase64: name.base64 } : {}),
      ...(fullPath.base64 ? { pathBase64: fullPath.base64 } : {}),
      ...(target?.base64 ? { targetBase64: target.base64 } : {}),
    }
  })
  return out.sort((a, b) => a.name.localeCompare(b.name))
}

interface Stamp {
  type: FileEntry['type']
  size: number
  mode: number
  mtimeNs: bigint
  target: string
}

/** The helper's last line when its walk stopped at the bytes a diff may carry. */
const TRUNCATED = Buffer.from('truncated\n')

/**
 * Walks a tree without following links: relative path (base64 of its bytes) → what identifies its
 * content; `truncated` when the walk stopped at `limit` entries or at the path bytes a diff may
 * carry (16 MiB: deep paths would otherwise make a diff of 100,000 entries 400 MB).
 */
async function stamps(
  root: string,
  limit: number,
  options: ReadOptions,
): Promise<{ entries: Map<string, Stamp>; truncated: boolean }> {
  const output = await readTree(root, ['stamps', String(limit)], options)
  // A line of its own: an entry line ends in a tab and a link target's base64, never a newline before it.
  const tail = output.subarray(Math.max(0, output.length - TRUNCATED.length - 1))
  const cut = tail.equals(TRUNCATED) || tail.equals(Buffer.concat([Buffer.from('\n'), TRUNCATED]))
  const entries = new Map<string, Stamp>()
  for (const entry of parseEntries(cut ? output.subarray(0, output.length - TRUNCATED.length) : output))
    entries.set(entry.name.toString('base64'), entry)
  return { entries, truncated: cut || entries.size >= limit }
}

/** Splits base64 paths into the UTF-8 ones (as strings) and the others (kept as base64). */
function onWire(paths: string[]): { text: string[]; bytes: string[] } {
  const text: string[] = []
  const bytes: string[] = []
  for (const encoded of paths) {
    const name = wireName(Buffer.from(encoded, 'base64'))
    if (name.base64) bytes.push(name.base64)
    else text.push(name.text)
  }
  return { text: text.sort(), bytes: bytes.sort() }
}

/**
 * Files added, changed and deleted between two trees. A file counts as changed when its type,
 * size, mode, link target or modification time differ (as rsync's quick check); directories only
 * when added or deleted. Paths that are not UTF-8 are listed, as base64 of their bytes, in
 * `bytePaths` instead.
 */
export async function diffTrees(
  fromRoot: string,
  toRoot: string,
  fromLabel: string,
  limit = 100_000,
  options: ReadOptions = {},
): Promise<WorkspaceDiff> {
  const [walkedBefore, walkedAfter] = await Promise.all([
    stamps(fromRoot, limit, options),
    stamps(toRoot, limit, options),
  ])
  const before = walkedBefore.entries
  const after = walkedAfter.entries
  const added: string[] = []
  const changed: string[] = []
  const deleted: string[] = []
  for (const [rel, stamp] of after) {
    const old = before.get(rel)
    if (!old) added.push(rel)
    else if (
      stamp.type !== 'directory' &&
      (old.type !== stamp.type ||
        old.size !== stamp.size ||
        old.mode !== stamp.mode ||
        old.mtimeNs !== stamp.mtimeNs ||
        old.target !== stamp.target)
    ) {
      changed.push(rel)
    }
  }
  for (const rel of before.keys()) if (!after.has(rel)) deleted.push(rel)
  const [a, c, d] = [onWire(added), onWire(changed), onWire(deleted)]
  return {
    from: fromLabel,
    added: a.text,
    changed: c.text,
    deleted: d.text,
    truncated: walkedBefore.truncated || walkedAfter.truncated,
    ...(a.bytes.length + c.bytes.length + d.bytes.length > 0
      ? { bytePaths: { added: a.bytes, changed: c.bytes, deleted: d.bytes } }
      : {}),
  }
}

/**
 * Whether anything (a link included, never followed) is at `rel` beneath `root`, answered from
 * the tree alone: where a link in the path points on the host changes nothing. A first component
 * that is not there (the common answer) is known from one `lstat` of a name directly beneath the
 * root, which follows nothing; anything deeper is walked by descriptors by the reader helper.
 */
export async function pathExists(root: string, rel: string, options: ReadOptions = {}): Promise<boolean> {
  const first = rel.split('/').find((part) => part !== '' && part !== '.')
  if (first === undefined)
    return await lstat(root).then(
      () => true,
      () => false,
    )
  if (first !== '..') {
    const there = await lstat(path.join(root, first)).then(
      () => true,
      (error: NodeJS.ErrnoException) => {
        if (error.code === 'ENOENT') return false
        throw error
      },
    )
    if (!there) return false
  }
  try {
    const answer = await readTree(root, ['exists', pathArg(rel)], {
      subject: `/workspace/${rel}`,
      ...options,
    })
    return answer.toString('utf8').trim() === 'yes'
  } catch (error) {
    if (error instanceof CairnProblem && error.code === 'not_found') return false
    throw error
  }
}
