import { createHash } from 'node:crypto'
import { lstat, readdir, readFile, readlink } from 'node:fs/promises'
import path from 'node:path'

/** Every entry of a tree: type, mode, content digest or link target (what "identical" means). */
export async function treeManifest(root: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {}
  const walk = async (rel: string) => {
    for (const entry of await readdir(path.join(root, rel), { withFileTypes: true })) {
      const childRel = rel ? `${rel}/${entry.name}` : entry.name
      const abs = path.join(root, childRel)
      const info = await lstat(abs)
      const mode = (info.mode & 0o7777).toString(8)
      if (info.isSymbolicLink()) out[childRel] = `link ${mode} -> ${await readlink(abs)}`
      else if (info.isDirectory()) {
        out[childRel] = `dir ${mode}`
        await walk(childRel)
      } else
        out[childRel] = `file ${mode} ${createHash('sha256')
          .update(await readFile(abs))
          .digest('hex')}`
    }
  }
  await walk('')
  return out
}
