import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { PassThrough, type Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { CairnProblem } from '@cairn/protocol'
import type { EnvStore } from '../storage/env-store.js'
import { assertInertTree } from '../storage/inert-tree.js'
import type { StoragePool } from '../storage/pool.js'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'

/**
 * A read-only tree of the pool that a node may lack and another has: a revision, or a dependency
 * environment (by key). A cluster ships both to a node before its first session of the revision.
 */
export type ShippedTree = { revisionId: string } | { dependencyEnvKey: string }

function describe(tree: ShippedTree): string {
  return 'revisionId' in tree
    ? `revision ${tree.revisionId}`
    : `dependency environment ${tree.dependencyEnvKey}`
}

function pathOf(pool: StoragePool, envs: EnvStore, tree: ShippedTree): string {
  return 'revisionId' in tree ? pool.revisionPath(tree.revisionId) : envs.envPath(tree.dependencyEnvKey)
}

/**
 * The tree, whole, as a tar stream: numeric owners and modes kept (the sandbox uid owns a
 * revision's files on every node), no compression (nodes talk over a fast link).
 */
export async function exportPoolTree(
  pool: StoragePool,
  envs: EnvStore,
  tree: ShippedTree,
): Promise<Readable> {
  const dir = pathOf(pool, envs, tree)
  if (!existsSync(dir)) throw new CairnProblem('not_found', `${describe(tree)} is not in this node's pool`)
  const tar = spawn('tar', ['-c', '--numeric-owner', '--xattrs', '-C', dir, '.'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    ...OWN_PROCESS_GROUP,
  })
  let stderr = ''
  tar.stderr.setEncoding('utf8').on('data', (chunk: string) => {
    stderr = (stderr + chunk).slice(-2000)
  })
  // Through a stream of our own: a child's stdout left paused loses what it held at exit, and
  // the end is told only once tar said it succeeded (a failed export is an error, not a short tar).
  const out = new PassThrough()
  tar.stdout.pipe(out, { end: false })
  tar.on('close', (code, signal) => {
    if (out.destroyed) return
    if (code === 0) out.end()
    else
      out.destroy(
        new CairnProblem(
          'storage_error',
          `exporting ${describe(tree)} failed (${code ?? signal}): ${stderr.trim()}`,
        ),
      )
  })
  out.on('close', () => {
    if (tar.exitCode === null) tar.kill('SIGTERM')
  })
  return out
}

/**
 * Makes the tree here from `exportPoolTree`'s stream, sealed read-only as the original is; a tree
 * already here is kept (the stream is read to its end and dropped). A stream that breaks leaves
 * nothing (the staging tree is removed). Imports of one tree may run at once (two API replicas
 * shipping a revision for their first sessions): each unpacks into a staging tree of its own, the
 * first to seal wins and the others drop theirs.
 */
export async function importPoolTree(
  pool: StoragePool,
  envs: EnvStore,
  tree: ShippedTree,
  tenantId: string,
  stream: Readable,
): Promise<void> {
  const target = pathOf(pool, envs, tree)
  if (existsSync(target)) {
    stream.resume()
    await new Promise<void>((resolve) =>
      stream
        .once('end', resolve)
        .once('error', () => resolve())
        .once('close', resolve),
    )
    return
  }
  const unique = randomBytes(6).toString('hex')
  const staging =
    'revisionId' in tree
      ? await pool.createStaging(`ship${tree.revisionId}${unique}`, tenantId)
      : await envs.createStaging(
          tree.dependencyEnvKey,
          `shipenv_${tree.dependencyEnvKey.replace(/[^0-9a-z]/g, '')}${unique}`,
          tenantId,
        )
  try {
    // --ignore-zeros: tar reads its input to the end instead of leaving at the end-of-archive
    // blocks, which closed its stdin before the stream's last bytes were written ("Premature close"
    // on a loaded machine).
    const tar = spawn(
      'tar',
      ['-x', '--ignore-zeros', '--numeric-owner', '--same-owner', '-p', '--xattrs', '-C', staging],
      { stdio: ['pipe', 'ignore', 'pipe'], ...OWN_PROCESS_GROUP },
    )
    let stderr = ''
    tar.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr = (stderr + chunk).slice(-2000)
    })
    const exited = new Promise<number | null>((resolve) => tar.on('close', resolve))
    await pipeline(stream, tar.stdin).catch((error: unknown) => {
      tar.kill('SIGTERM')
      throw error
    })
    const code = await exited
    if (code !== 0)
      throw new CairnProblem(
        'storage_error',
        `importing ${describe(tree)} failed (tar ${code}): ${stderr.trim()}`,
      )
    // The exporting node is another machine: what no sandbox makes is not taken from it.
    await assertInertTree(staging, describe(tree))
    // Another import of the same tree may have sealed it meanwhile: its copy stands.
    if (existsSync(target)) {
      await pool.discardStaging(staging)
      return
    }
    if ('revisionId' in tree) await pool.sealRevision(staging, tree.revisionId, tenantId)
    else await envs.seal(staging, tree.dependencyEnvKey, tenantId)
  } catch (error) {
    await pool.discardStaging(staging).catch(() => undefined)
    // Sealing lost a race with another import of the same tree: that one is the tree.
    if (existsSync(target)) return
    throw error
  }
}
