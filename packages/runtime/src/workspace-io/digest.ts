import { type ReadOptions, readTree } from './reader.js'

/**
 * A content digest of a tree (`sha256:…`), computed by the workspace reader off the event loop:
 * every entry below `root` (not the root itself) as its relative path's bytes, type, permission
 * bits, and content hash or link target, in byte order of the names. Owners and times are left
 * out, so an exported and re-imported workspace digests the same. A file's content hash is cut in
 * 1 MiB blocks, a run of all-zero blocks hashing as its count: holes are never read, so a sparse
 * file costs its data, not its size. FIFOs, sockets and devices count by type and mode and are
 * never opened. See `cmd_digest` in helpers/workspace-reader.py (definition `cairn-tree-v2`).
 */
export async function treeDigest(root: string, options: ReadOptions = {}): Promise<string> {
  return (await readTree(root, ['digest'], { background: true, ...options })).toString('utf8').trim()
}
