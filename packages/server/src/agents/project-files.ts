import { createHash } from 'node:crypto'
import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import path from 'node:path'
import type { RuntimePort } from '@cairn/runtime/port'
import { hashTree } from './tree-hash.js'

/** The files of a deployed project, as the manifest check and the build plan read them. */
export interface ProjectFiles {
  /** Whether anything is at `rel` (a path below the project's root). */
  has(rel: string): Promise<boolean>
  /** The bytes of the regular file at `rel`. */
  read(rel: string): Promise<Buffer>
  /** A digest of every entry of the project (paths, kinds, modes, contents, link targets). */
  digest(): Promise<string>
}

/** A revision being deployed, read through the runtime's port (its reader never follows a link). */
export function stagedProject(
  runtime: Pick<RuntimePort, 'hasPath' | 'openFile' | 'digest'>,
  revisionId: string,
): ProjectFiles {
  const tree = { stagedRevisionId: revisionId }
  return {
    has: (rel) => runtime.hasPath(tree, rel),
    read: async (rel) => {
      const { stream } = await runtime.openFile(tree, Buffer.from(rel))
      const chunks: Buffer[] = []
      for await (const chunk of stream) chunks.push(chunk as Buffer)
      return Buffer.concat(chunks)
    },
    digest: () => runtime.digest(tree),
  }
}

/** A project in a directory of this machine (tools and tests that check a manifest). */
export function projectInDirectory(dir: string): ProjectFiles {
  return {
    has: async (rel) => existsSync(path.join(dir, rel)),
    read: (rel) => readFile(path.join(dir, rel)),
    digest: async () => {
      const hash = createHash('sha256')
      await hashTree(hash, dir)
      return `sha256:${hash.digest('hex')}`
    },
  }
}
