import { writeFile } from 'node:fs/promises'
import path from 'node:path'
import { scratchDir } from './scratch.js'

/** Writes a throwaway agent project (files by relative path) and returns its directory. */
export async function makeProject(files: Record<string, string>): Promise<string> {
  const dir = await scratchDir('cairn-project-')
  for (const [name, body] of Object.entries(files)) {
    await writeFile(path.join(dir, name), body)
  }
  return dir
}
