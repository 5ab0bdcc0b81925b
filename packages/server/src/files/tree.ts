import type { Dirent } from 'node:fs'
import { lstat, readdir, readlink } from 'node:fs/promises'
import path from 'node:path'
import type { FileEntry, WorkspaceDiff } from '@cairn/protocol'

function typeOf(entry: {
  isFile(): boolean
  isDirectory(): boolean
  isSymbolicLink(): boolean
}): FileEntry['type'] {
  if (entry.isSymbolicLink()) return 'symlink'
  if (entry.isDirectory()) return 'directory'
  if (entry.isFile()) return 'file'
  return 'other'
}

/** Lists one directory (no recursion, symlinks reported, not followed). */
export async function listDirectory(absDir: string, relDir: string): Promise<FileEntry[]> {
  const entries: Dirent[] = await readdir(absDir, { withFileTypes: true })
  const out: FileEntry[] = []
  for (const entry of entries) {
    const abs = path.join(absDir, entry.name)
    // An entry gone (or unreadable) since readdir is not listed: the listing is of what is there.
    const info = await lstat(abs).catch(() => undefined)
    if (!info) continue
    const type = typeOf(info)
    out.push({
      name: entry.name,
      path: `/workspace/${relDir ? `${relDir}/` : ''}${entry.name}`,
      type,
      size: info.size,
      mode: info.mode & 0o7777,
      modifiedAt: info.mtime.toISOString(),
      ...(type === 'symlink' ? { target: await readlink(abs).catch(() => '') } : {}),
    })
  }
  return out.sort((a, b) => a.name.localeCompare(b.name))
}

interface Stamp {
  type: FileEntry['type']
  size: number
  mode: number
  mtimeNs: bigint
  target: string
}

/** Walks a tree without following links: relative path → what identifies its content. */
async function stamps(root: string, limit: number): Promise<Map<string, Stamp>> {
  const out = new Map<string, Stamp>()
  const walk = async (rel: string): Promise<void> => {
    const entries = await readdir(path.join(root, rel), { withFileTypes: true }).catch(() => [])
    for (const entry of entries) {
      if (out.size >= limit) return
      const childRel = rel ? `${rel}/${entry.name}` : entry.name
      const abs = path.join(root, childRel)
      // An entry gone (or unreadable) since readdir is skipped, as if it had not been there.
      const info = await lstat(abs, { bigint: true }).catch(() => undefined)
      if (!info) continue
      const type = typeOf(info)
      out.set(childRel, {
        type,
        size: Number(info.size),
        mode: Number(info.mode & 0o7777n),
        mtimeNs: info.mtimeNs,
        target: type === 'symlink' ? await readlink(abs).catch(() => '') : '',
      })
      if (type === 'directory') await walk(childRel)
    }
  }
  await walk('')
  return out
}

/**
 * Files added, changed and deleted between two trees. A file counts as changed when its type,
 * size, mode, link target or modification time differ (as rsync's quick check); directories only
 * when added or deleted.
 */
export async function diffTrees(
  fromRoot: string,
  toRoot: string,
  fromLabel: string,
  limit = 100_000,
): Promise<WorkspaceDiff> {
  const [before, after] = await Promise.all([stamps(fromRoot, limit), stamps(toRoot, limit)])
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
  return {
    from: fromLabel,
    added: added.sort(),
    changed: changed.sort(),
    deleted: deleted.sort(),
    truncated: before.size >= limit || after.size >= limit,
  }
}
