import { spawn } from 'node:child_process'
import { lstat } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'

/**
 * Refuses a tree that came from outside this machine (another node's export, the bucket) if it
 * holds what no sandbox can make and the host should never keep: a block or character device
 * (other than the 0:0 whiteout an unprivileged user may create), or a set-uid or set-gid file
 * owned by root. Sandboxes see pool trees through nodev,nosuid mounts today; this keeps such
 * files out of the pool whatever mounts them later. `chain_invalid`, naming the first one found.
 */
export async function assertInertTree(root: string, subject: string): Promise<void> {
  const found = await findSuspects(root)
  for (const relative of found) {
    const info = await lstat(path.join(root, relative))
    if (info.isCharacterDevice() && info.rdev === 0) continue
    const what =
      info.isBlockDevice() || info.isCharacterDevice() ? 'a device node' : 'a set-id file owned by root'
    throw new CairnProblem('chain_invalid', `${subject} holds ${what} (${relative}): refused`)
  }
}

/** Paths (relative to root) of devices and root-owned set-id files, by find(1): no tree is read whole. */
function findSuspects(root: string): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const find = spawn(
      'find',
      [
        root,
        '-xdev',
        '(',
        '-type',
        'b',
        '-o',
        '-type',
        'c',
        '-o',
        '-perm',
        '-4000',
        '-uid',
        '0',
        '-o',
        '-perm',
        '-2000',
        '-gid',
        '0',
        ')',
        '-printf',
        '%P\\0',
      ],
      { stdio: ['ignore', 'pipe', 'pipe'], ...OWN_PROCESS_GROUP },
    )
    const chunks: Buffer[] = []
    let stderr = ''
    find.stdout.on('data', (chunk: Buffer) => chunks.push(chunk))
    find.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr = (stderr + chunk).slice(-2000)
    })
    find.on('error', reject)
    find.on('close', (code) => {
      if (code !== 0)
        return reject(
          new CairnProblem('storage_error', `checking ${root} failed (find ${code}): ${stderr.trim()}`),
        )
      resolve(
        Buffer.concat(chunks)
          .toString('utf8')
          .split('\0')
          .filter((name) => name !== ''),
      )
    })
  })
}
