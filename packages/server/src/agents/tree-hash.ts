import type { Hash } from 'node:crypto'
import { createReadStream } from 'node:fs'
import { lstat, readdir, readlink } from 'node:fs/promises'
import path from 'node:path'
import { pipeline } from 'node:stream/promises'

/**
 * Feeds every entry under `dir` into `hash` in a fixed order: its path, its kind, the executable
 * bit, and a file's bytes or a link's target. Two trees hash alike only when a program reading
 * them sees the same thing.
 */
export async function hashTree(hash: Hash, dir: string, relative = '.'): Promise<void> {
  const entries = (await readdir(path.join(dir, relative))).sort()
  for (const name of entries) {
    const rel = path.posix.join(relative, name)
    const full = path.join(dir, rel)
    const stat = await lstat(full)
    if (stat.isDirectory()) {
      hash.update(`d\0${rel}\0`)
      await hashTree(hash, dir, rel)
    } else if (stat.isSymbolicLink()) {
      hash.update(`l\0${rel}\0${await readlink(full)}\0`)
    } else if (stat.isFile()) {
      hash.update(`f\0${rel}\0${stat.mode & 0o111 ? 'x' : '-'}\0${stat.size}\0`)
      await pipeline(createReadStream(full), async (source: AsyncIterable<Buffer>) => {
        for await (const chunk of source) hash.update(chunk)
      })
    } else {
      hash.update(`o\0${rel}\0`)
    }
  }
}
