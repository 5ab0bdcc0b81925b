import { createHash } from 'node:crypto'
import path from 'node:path'
import { pipeline } from 'node:stream/promises'
import { CairnProblem } from '@cairn/protocol'
import { archiveStream } from '@cairn/runtime/port'
import * as tar from 'tar'

export interface ArchiveLimits {
  maxFiles: number
  maxUnpackedBytes: number
}

export const DEFAULT_ARCHIVE_LIMITS: ArchiveLimits = {
  maxFiles: 50_000,
  maxUnpackedBytes: 1024 * 1024 * 1024,
}

export interface ArchiveSummary {
  fileCount: number
  sizeBytes: number
  /** SHA-256 over every entry's path, type, mode and content, in archive order. */
  contentHash: string
}

const ALLOWED_TYPES = new Set(['File', 'OldFile', 'ContiguousFile', 'Directory', 'SymbolicLink', 'Link'])

function refuse(message: string, entryPath?: string): never {
  throw new CairnProblem(
    'invalid_archive',
    message,
    entryPath === undefined ? undefined : { path: entryPath },
  )
}

/** Normalises an archive path and refuses absolute paths and `..` segments. */
export function checkEntryPath(raw: string): string {
  if (raw.includes('\0')) refuse('archive entry path contains a NUL byte', raw)
  if (raw.startsWith('/') || /^[a-zA-Z]:[\\/]/.test(raw))
    refuse(`archive entry has an absolute path: ${raw}`, raw)
  const segments = raw.split(/[\\/]+/).filter((s) => s !== '' && s !== '.')
  if (segments.includes('..')) refuse(`archive entry escapes the project with '..': ${raw}`, raw)
  return segments.join('/')
}

function checkLinkTarget(entryPath: string, target: string, kind: 'symlink' | 'hardlink'): void {
  if (!target) refuse(`archive ${kind} ${entryPath} has an empty target`, entryPath)
  if (target.startsWith('/'))
    refuse(`archive ${kind} ${entryPath} points to an absolute path: ${target}`, entryPath)
  const base = kind === 'symlink' ? path.posix.dirname(entryPath) : ''
  const resolved = path.posix.normalize(path.posix.join(base, target))
  if (resolved === '..' || resolved.startsWith('../')) {
    refuse(`archive ${kind} ${entryPath} points outside the project: ${target}`, entryPath)
  }
}

/**
 * node-tar reserves an entry's path and its raw link path together and waits forever when one is
 * beneath the other (`a/b -> a`, `d -> d/x`, for any entry type that carries a link path): such an
 * archive would hang the deploy, so it is refused here.
 */
function checkLinkNesting(entryPath: string, linkpath: string | undefined): void {
  if (!linkpath) return
  const target = path.posix.normalize(linkpath).replace(/\/+$/, '')
  if (target === entryPath || target === '.' || target === '') return
  if (entryPath.startsWith(`${target}/`) || target.startsWith(`${entryPath}/`))
    refuse(`archive entry ${entryPath} links to ${linkpath}, which contains it or lies inside it`, entryPath)
}

/**
 * Reads the whole archive once without writing anything, refusing hostile content (absolute paths,
 * `..`, links out of the tree, device files, too many files, too many bytes once unpacked).
 */
export async function inspectArchive(
  archive: Buffer,
  limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
): Promise<ArchiveSummary> {
  const hash = createHash('sha256')
  let fileCount = 0
  let sizeBytes = 0
  let problem: unknown
  // Symlinks seen so far: each target is checked on its own path, so a later entry that passes
  // through one (`a -> ..`, then `a/b -> ..`) could resolve out of the tree; such entries are refused.
  const links = new Set<string>()
  const throughLink = (entryPath: string): string | undefined => {
    const segments = entryPath.split('/')
    for (let i = 1; i < segments.length; i++) {
      const prefix = segments.slice(0, i).join('/')
      if (links.has(prefix)) return prefix
    }
    return undefined
  }
  /** Paths of entries so far that are not directories: nothing may be unpacked beneath them. */
  const nonDirectories = new Set<string>()
  /** Directories entries so far lie beneath: none may be replaced by a file or a link. */
  const parents = new Set<string>()
  const parser = new tar.Parser({
    strict: true,
    onReadEntry: (entry) => {
      try {
        if (problem) throw problem
        const type = String(entry.type)
        const entryPath = checkEntryPath(entry.path)
        if (!ALLOWED_TYPES.has(type))
          refuse(`archive entry ${entryPath} is a ${type}, which is not allowed`, entryPath)
        const via = throughLink(entryPath)
        if (via !== undefined)
          refuse(`archive entry ${entryPath} goes through the symbolic link ${via}`, entryPath)
        if (type === 'SymbolicLink') {
          checkLinkTarget(entryPath, entry.linkpath ?? '', 'symlink')
          links.add(entryPath)
        } else {
          // A later entry of the same name replaces the link when unpacked.
          links.delete(entryPath)
        }
        if (type === 'Link') {
          const target = checkEntryPath(entry.linkpath ?? '')
          checkLinkTarget(target, '.', 'hardlink')
          const targetVia = throughLink(target)
          if (targetVia !== undefined)
            refuse(`archive hardlink ${entryPath} goes through the symbolic link ${targetVia}`, entryPath)
        }
        // A path through an earlier file or link: node-tar cannot unpack it and, for a hard link
        // below a file, never finishes (the deploy would hang). Through a symlink it would leave.
        // Likewise a file or link replacing a directory that holds earlier entries.
        for (let at = entryPath.indexOf('/'); at !== -1; at = entryPath.indexOf('/', at + 1)) {
          const parent = entryPath.slice(0, at)
          if (nonDirectories.has(parent))
            refuse(`archive entry ${entryPath} lies beneath ${parent}, which is not a directory`, entryPath)
          parents.add(parent)
        }
        checkLinkNesting(entryPath, entry.linkpath)
        if (type === 'Directory') nonDirectories.delete(entryPath)
        else if (parents.has(entryPath))
          refuse(`archive entry ${entryPath} replaces a directory that holds earlier entries`, entryPath)
        else nonDirectories.add(entryPath)
        fileCount++
        if (fileCount > limits.maxFiles) refuse(`archive has more than ${limits.maxFiles} entries`)
        sizeBytes += entry.size ?? 0
        if (sizeBytes > limits.maxUnpackedBytes) {
          refuse(`archive unpacks to more than ${limits.maxUnpackedBytes} bytes`)
        }
        hash.update(`${type}\0${entryPath}\0${(entry.mode ?? 0) & 0o777}\0${entry.linkpath ?? ''}\0`)
        entry.on('data', (chunk: Buffer) => hash.update(chunk))
      } catch (error) {
        problem ??= error
        entry.resume()
        parser.abort(error as Error)
      }
    },
  })
  try {
    await pipeline(archiveStream(archive), parser)
  } catch (error) {
    if (problem) throw problem
    if (error instanceof CairnProblem) throw error
    refuse(`archive is not a valid tar.gz: ${(error as Error).message}`)
  }
  if (problem) throw problem
  if (fileCount === 0) refuse('archive is empty')
  return { fileCount, sizeBytes, contentHash: `sha256:${hash.digest('hex')}` }
}
