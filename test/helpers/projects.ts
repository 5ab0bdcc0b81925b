import { mkdtemp, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

/** Writes a throwaway agent project (files by relative path) and returns its directory. */
export async function makeProject(files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-project-'))
  for (const [name, body] of Object.entries(files)) {
    await writeFile(path.join(dir, name), body)
  }
  return dir
}
