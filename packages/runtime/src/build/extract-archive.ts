import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { CairnProblem } from '@cairn/protocol'
import * as tar from 'tar'
import { spaceProblem } from '../storage/space-problem.js'

/** How long an extraction may go without reaching a new entry before it is given up. */
const DEFAULT_EXTRACT_STALL_MS = 120_000

function refuse(message: string): never {
  throw new CairnProblem('invalid_archive', message)
}

/**
 * Compressed bytes per write into a tar parser. A parser inflates each write at once, and deflate
 * inflates up to about 1,032 times its input: a whole 1 MiB upload written at once became 1 GiB
 * in memory before any limit was looked at. In 16 KiB writes one holds at most about 16 MiB.
 */
const ARCHIVE_CHUNK_BYTES = 16 * 1024

/** An archive held in a Buffer as a stream of small writes (see `ARCHIVE_CHUNK_BYTES`). */
export function archiveStream(archive: Buffer): Readable {
  return Readable.from(
    (function* () {
      for (let at = 0; at < archive.length; at += ARCHIVE_CHUNK_BYTES)
        yield archive.subarray(at, at + ARCHIVE_CHUNK_BYTES)
    })(),
  )
}

/**
 * Extracts an archive that the server's `inspectArchive` accepted into `dir` (owner not preserved;
 * setuid, setgid and sticky bits dropped: the server unpacks as root). What the file system refuses
 * (a name too long, a file where a directory must go, a hard link to nothing…) is `invalid_archive`;
 * a write refused for space is not the archive's fault: `quota_exceeded` at the tenant's quota,
 * `storage_error` in a full pool (`spaceProblem`). Entry errors are collected rather than thrown,
 * so this returns only once every write is done: the caller may delete `dir` at once.
 */
export async function extractArchive(
  archive: Buffer,
  dir: string,
  options: { stallTimeoutMs?: number } = {},
): Promise<void> {
  const problems: { message: string; errno?: unknown }[] = []
  const stallTimeoutMs = options.stallTimeoutMs ?? DEFAULT_EXTRACT_STALL_MS
  let stalled: NodeJS.Timeout | undefined
  let onStall: () => void = () => undefined
  const progress = () => {
    if (stalled) clearTimeout(stalled)
    stalled = setTimeout(() => onStall(), stallTimeoutMs)
  }
  const extractor = tar.x({
    cwd: dir,
    strict: false,
    preserveOwner: false,
    noMtime: false,
    filter: (_path, entry) => {
      progress()
      if (typeof entry.mode === 'number') entry.mode &= 0o777
      return true
    },
    onwarn: (code, message, data) => {
      if (code !== 'TAR_ENTRY_INFO') problems.push({ message: String(message), errno: data?.errno })
    },
  })
  // node-tar has waited forever on some entry orders the checks above now refuse; should another
  // one slip through, the deploy fails instead of hanging with its staging area.
  const stall = new Promise<never>((_resolve, reject) => {
    onStall = () => reject(new Error(`no progress for ${stallTimeoutMs} ms`))
  })
  progress()
  try {
    await Promise.race([pipeline(archiveStream(archive), extractor), stall])
  } catch (error) {
    problems.unshift({ message: (error as Error).message, errno: (error as { errno?: unknown }).errno })
  } finally {
    clearTimeout(stalled)
  }
  if (problems.length === 0) return
  // A refusal for space fails every entry after it: it is the one to answer, wherever it came.
  for (const { errno } of problems) {
    const problem = spaceProblem(errno, 'unpacking the archive')
    if (problem) throw problem
  }
  refuse(`archive could not be unpacked: ${problems[0]?.message}`)
}
