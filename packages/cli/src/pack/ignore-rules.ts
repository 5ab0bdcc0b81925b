import { readFile } from 'node:fs/promises'
import path from 'node:path'
import ignore, { type Ignore } from 'ignore'

/** Never uploaded: VCS data, dependency folders (rebuilt on the server), caches and secrets in .env files. */
export const DEFAULT_IGNORES = [
  '.git',
  '.hg',
  '.svn',
  'node_modules',
  '.venv',
  'venv',
  '__pycache__',
  '*.pyc',
  '.DS_Store',
  '.env*',
  '!.env.example',
]

async function readLines(file: string): Promise<string[]> {
  try {
    return (await readFile(file, 'utf8')).split(/\r?\n/)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return []
    throw error
  }
}

/** The rules for a project: defaults, then the root .gitignore and .cairnignore, then cairn.yaml's `ignore:`. */
export async function projectIgnore(dir: string, manifestIgnore: string[] = []): Promise<Ignore> {
  return ignore()
    .add(DEFAULT_IGNORES)
    .add(await readLines(path.join(dir, '.gitignore')))
    .add(await readLines(path.join(dir, '.cairnignore')))
    .add(manifestIgnore)
}
