import { lstat, readdir, readlink } from 'node:fs/promises'
import path from 'node:path'
import { gzipSync } from 'node:zlib'
import type { Ignore } from 'ignore'
import { create, Header } from 'tar'
import { MANIFEST_FILES } from './manifest.js'

export interface PackedProject {
  /** tar.gz bytes. */
  archive: Uint8Array
  /** Files (and symlinks) in the archive, POSIX paths, sorted; generated ones included. */
  files: string[]
  /** Total size of the files before compression. */
  bytes: number
  skipped: string[]
}

export interface ProjectListing {
  /** What goes into the tar: files, symlinks, and directories that are empty (others are implied). */
  entries: string[]
  files: string[]
  bytes: number
  /** Symlinks left out because they point outside the project (the server would refuse them). */
  skipped: string[]
}

/** Lists what would be uploaded, in a stable order. */
export async function listProject(dir: string, rules: Ignore): Promise<ProjectListing> {
  const listing: ProjectListing = { entries: [], files: [], bytes: 0, skipped: [] }
  const walk = async (rel: string): Promise<void> => {
    const children = await readdir(path.join(dir, rel), { withFileTypes: true })
    if (children.length === 0 && rel !== '') listing.entries.push(`${rel}/`)
    children.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
    for (const child of children) {
      const childRel = rel === '' ? child.name : `${rel}/${child.name}`
      const forced = rel === '' && (MANIFEST_FILES as readonly string[]).includes(child.name)
      if (child.isDirectory()) {
        if (!rules.ignores(`${childRel}/`)) await walk(childRel)
        continue
      }
      if (!(child.isFile() || child.isSymbolicLink()) || (!forced && rules.ignores(childRel))) continue
      if (child.isSymbolicLink()) {
        const target = await readlink(path.join(dir, childRel))
        const resolved = path.posix.normalize(path.posix.join(path.posix.dirname(childRel), target))
        if (target.startsWith('/') || resolved === '..' || resolved.startsWith('../')) {
          listing.skipped.push(childRel)
          continue
        }
      } else {
        listing.bytes += (await lstat(path.join(dir, childRel))).size
      }
      listing.entries.push(childRel)
      listing.files.push(childRel)
    }
  }
  await walk('')
  return listing
}

/** A tar entry for a file that exists only in memory (a generated cairn.yaml). */
function virtualEntry(name: string, content: string): Buffer {
  const body = Buffer.from(content, 'utf8')
  const header = Buffer.alloc(512)
  new Header({
    path: name,
    mode: 0o644,
    uid: 0,
    gid: 0,
    size: body.length,
    mtime: new Date(),
    type: 'File',
  }).encode(header, 0)
  const padding = Buffer.alloc((512 - (body.length % 512)) % 512)
  return Buffer.concat([header, body, padding])
}

/** Packs `dir` as tar.gz, applying `rules`; `extra` files (path → text) are added at the root first. */
export async function packProject(
  dir: string,
  rules: Ignore,
  extra: Record<string, string> = {},
): Promise<PackedProject> {
  const listed = await listProject(dir, rules)
  const chunks: Buffer[] = Object.entries(extra).map(([name, content]) => virtualEntry(name, content))
  const entries = listed.entries.filter((e) => !(e in extra))
  if (entries.length > 0) {
    const stream = create(
      { cwd: dir, portable: true, noDirRecurse: true, follow: false, gzip: false },
      entries,
    )
    for await (const chunk of stream) chunks.push(Buffer.from(chunk as Uint8Array))
  } else {
    chunks.push(Buffer.alloc(1024))
  }
  const extraBytes = Object.values(extra).reduce((sum, text) => sum + Buffer.byteLength(text), 0)
  return {
    archive: new Uint8Array(gzipSync(Buffer.concat(chunks))),
    files: [...new Set([...Object.keys(extra), ...listed.files])].sort(),
    bytes: listed.bytes + extraBytes,
    skipped: listed.skipped,
  }
}
