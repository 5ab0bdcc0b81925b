import { createHash } from 'node:crypto'
import { constants, createReadStream } from 'node:fs'
import { lstat, open, readdir, readlink } from 'node:fs/promises'
import { pipeline } from 'node:stream/promises'

/** Files up to this size are read in one call; larger ones are streamed through the hash. */
const WHOLE_READ_BYTES = 1024 * 1024
const SLASH = Buffer.from('/')

function typeCode(info: {
  isFile(): boolean
  isDirectory(): boolean
  isSymbolicLink(): boolean
}): 'f' | 'd' | 'l' | 'o' {
  if (info.isSymbolicLink()) return 'l'
  if (info.isDirectory()) return 'd'
  if (info.isFile()) return 'f'
  return 'o'
}

async function fileHash(abs: Buffer, size: number): Promise<string> {
  // O_NOFOLLOW: the walk saw a regular file here; never let a swapped-in link redirect the read.
  const handle = await open(abs, constants.O_RDONLY | constants.O_NOFOLLOW)
  try {
    const hash = createHash('sha256')
    if (size <= WHOLE_READ_BYTES) hash.update(await handle.readFile())
    else await pipeline(createReadStream('', { fd: handle.fd, autoClose: false }), hash)
    return hash.digest('hex')
  } finally {
    await handle.close()
  }
}

/**
 * A content digest of a tree: every entry below `root` (not the root itself) as its relative
 * path, type, permission bits, and content hash or link target, in byte order of the path. Owners
 * and times are left out, so an exported and re-imported workspace digests the same. Names are
 * handled as raw bytes: two names that differ only in invalid UTF-8 must not collide.
 */
export async function treeDigest(root: string): Promise<string> {
  const digest = createHash('sha256')
  digest.update('cairn-tree-v1\n')
  const rootBuf = Buffer.from(root)
  const walk = async (rel: Buffer | undefined): Promise<void> => {
    const dirAbs = rel ? Buffer.concat([rootBuf, SLASH, rel]) : rootBuf
    const names = (await readdir(dirAbs, { encoding: 'buffer' })).sort(Buffer.compare)
    for (const name of names) {
      const childRel = rel ? Buffer.concat([rel, SLASH, name]) : name
      const abs = Buffer.concat([rootBuf, SLASH, childRel])
      const info = await lstat(abs)
      const type = typeCode(info)
      let payload = ''
      if (type === 'l') payload = (await readlink(abs, { encoding: 'buffer' })).toString('hex')
      else if (type === 'f') payload = await fileHash(abs, info.size)
      // One record per entry; the path is hex so no byte of a name can forge a separator.
      digest.update(`${type} ${(info.mode & 0o7777).toString(8)} ${childRel.toString('hex')} ${payload}\n`)
      if (type === 'd') await walk(childRel)
    }
  }
  await walk(undefined)
  return `sha256:${digest.digest('hex')}`
}
