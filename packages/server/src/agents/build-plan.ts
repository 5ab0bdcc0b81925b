import { createHash } from 'node:crypto'
import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import path from 'node:path'

export type DependencyKind = 'node' | 'python'

export interface BuildPlan {
  /** How dependencies are installed, when the project declares any. */
  dependencies:
    | {
        kind: DependencyKind
        /** Files copied into the environment before installing (manifest and lockfile). */
        files: string[]
        command: string[]
        /** Content address of the environment: same lockfile, same environment, built once. */
        envKey: string
      }
    | undefined
  /** Optional `setup:` command from cairn.yaml, run in the revision after dependencies. */
  setup: string[] | undefined
}

const ENV_FORMAT = 'env-v1'

async function hashFiles(dir: string, files: string[], salt: string): Promise<string> {
  const hash = createHash('sha256').update(`${ENV_FORMAT}\0${salt}\0`)
  for (const file of files) {
    hash.update(`${file}\0`)
    hash.update(await readFile(path.join(dir, file)))
    hash.update('\0')
  }
  return hash.digest('hex').slice(0, 32)
}

/** Decides what a revision's build does, from the files at the project root. */
export async function planBuild(projectDir: string, setup: string[] | undefined): Promise<BuildPlan> {
  const has = (file: string) => existsSync(path.join(projectDir, file))
  if (has('package.json')) {
    const lock = has('package-lock.json')
      ? 'package-lock.json'
      : has('npm-shrinkwrap.json')
        ? 'npm-shrinkwrap.json'
        : undefined
    const files = lock ? ['package.json', lock] : ['package.json']
    const command = lock
      ? ['npm', 'ci', '--no-audit', '--no-fund', '--ignore-scripts=false']
      : ['npm', 'install', '--no-audit', '--no-fund', '--no-package-lock']
    return {
      dependencies: {
        kind: 'node',
        files,
        command,
        envKey: `node-${await hashFiles(projectDir, files, command.join(' '))}`,
      },
      setup,
    }
  }
  if (has('requirements.txt')) {
    const command = [
      'python3',
      '-m',
      'pip',
      'install',
      '--no-input',
      '--target',
      '/workspace/python',
      '-r',
      'requirements.txt',
    ]
    return {
      dependencies: {
        kind: 'python',
        files: ['requirements.txt'],
        command,
        envKey: `python-${await hashFiles(projectDir, ['requirements.txt'], command.join(' '))}`,
      },
      setup,
    }
  }
  if (has('pyproject.toml')) {
    const command = ['python3', '-m', 'pip', 'install', '--no-input', '--target', '/workspace/python', '/src']
    return {
      dependencies: {
        kind: 'python',
        files: ['pyproject.toml'],
        command,
        envKey: `python-${await hashFiles(projectDir, ['pyproject.toml'], command.join(' '))}`,
      },
      setup,
    }
  }
  return { dependencies: undefined, setup }
}
