import { existsSync } from 'node:fs'
import { readdir, rm, stat } from 'node:fs/promises'
import path from 'node:path'
import { execTool } from '../util/exec.js'
import { BACKGROUND_NICENESS } from '../workspace-io/reader.js'
import { type StreamTool, startTool } from './stream-parts.js'

/** Every subvolume's root directory has this inode number. */
const SUBVOLUME_ROOT_INO = 256

/**
 * `btrfs send` of a read-only snapshot: the whole tree, or with `parent` only what changed since
 * it (the parent must be on the same filesystem; the stream names it by UUID). Under nice: shipping
 * yields the CPU to the sessions' turns.
 */
export function btrfsSend(snapshotDir: string, parentDir?: string): StreamTool {
  const parent = parentDir ? ['-p', parentDir] : []
  return startTool(
    'nice',
    ['-n', String(BACKGROUND_NICENESS), 'btrfs', 'send', '-q', '--proto', '1', ...parent, snapshotDir],
    'read',
    'storage_error',
  )
}

/**
 * `btrfs receive` into `dir`, confined there by chroot (`-C`): a stream is untrusted, and one the
 * tool refuses fails as `chain_invalid`. It stops at the first stream's end (`-e`).
 */
export function btrfsReceive(dir: string): StreamTool {
  return startTool('btrfs', ['receive', '-C', '-e', dir], 'write', 'chain_invalid')
}

/** GNU tar of a tree, names as raw bytes, owners and modes and every xattr kept, holes skipped. */
export function tarCreate(dir: string): StreamTool {
  return startTool(
    'nice',
    [
      '-n',
      String(BACKGROUND_NICENESS),
      'tar',
      '--create',
      '--format=posix',
      '--sparse',
      '--sort=name',
      '--numeric-owner',
      '--xattrs',
      '--xattrs-include=*',
      '--one-file-system',
      '--directory',
      dir,
      '--file',
      '-',
      '.',
    ],
    'read',
    'storage_error',
  )
}

/**
 * GNU tar extraction into an empty `dir`, owners, modes and xattrs restored. Members are never
 * written outside `dir`: GNU tar drops leading slashes, refuses `..` members, and makes a link
 * whose target is absolute or climbs with `..` only after every other member is written (a
 * placeholder file holds its place), so no member is written through it.
 */
export function tarExtract(dir: string): StreamTool {
  return startTool(
    'tar',
    [
      '--extract',
      '--numeric-owner',
      '--same-owner',
      '--same-permissions',
      '--xattrs',
      '--xattrs-include=*',
      '--delay-directory-restore',
      '--directory',
      dir,
      '--file',
      '-',
    ],
    'write',
    'chain_invalid',
  )
}

/** Removes a directory holding received trees: subvolumes by `btrfs subvolume delete`, the rest by rm. */
export async function removeReceived(dir: string): Promise<void> {
  if (!existsSync(dir)) return
  for (const name of await readdir(dir)) {
    const entry = path.join(dir, name)
    const info = await stat(entry).catch(() => undefined)
    if (info?.isDirectory() && info.ino === SUBVOLUME_ROOT_INO)
      await execTool('btrfs', ['subvolume', 'delete', entry], { code: 'storage_error' })
  }
  await rm(dir, { recursive: true, force: true })
}
