import { lstat } from 'node:fs/promises'
import { execTool } from '../util/exec.js'

/**
 * Removes a tree a sandbox wrote, and that an agent may still be changing: GNU `rm -rf`, whose
 * walk (fts) enters each directory relative to its parent's descriptor without following links
 * and checks it is the directory it examined, so a directory swapped for a link to another
 * tenant's tree is never entered. Node's `fs.rm({ recursive: true })` reads a path again after
 * checking it and followed such a swap. `--one-file-system`: never into another mount. Tried again
 * while entries keep appearing (rm then finds a directory not empty).
 */
export async function removeTree(dir: string): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await execTool('rm', ['-rf', '--one-file-system', '--', dir], { code: 'storage_error' })
      return
    } catch (error) {
      const left = await lstat(dir).then(
        () => true,
        () => false,
      )
      if (!left) return
      if (attempt >= 3) throw error
    }
  }
}
