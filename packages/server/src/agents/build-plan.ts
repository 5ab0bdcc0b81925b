import { createHash } from 'node:crypto'
import type { ResolvedImage } from '../images/image-service.js'
import type { ProjectFiles } from './project-files.js'

export type DependencyKind = 'node' | 'python'

export interface BuildPlan {
  /** How dependencies are installed, when the project declares any. */
  dependencies:
    | {
        kind: DependencyKind
        /** Files copied into the environment before installing (manifest and lockfile). */
        files: string[]
        /**
         * Whether the install reads the whole project (mounted read-only at /src): `pip install` of
         * a pyproject.toml builds the project itself, with whatever build backend it names.
         */
        readsProject: boolean
        command: string[]
        /**
         * Content address of the environment, over every byte the install reads (the copied files,
         * or the whole project when it reads it), the command and the tenant: the same inputs build
         * the same environment once, and no environment is shared across tenants.
         */
        envKey: string
      }
    | undefined
  /** Optional `setup:` command from cairn.yaml, run in the revision after dependencies. */
  setup: string[] | undefined
  /** The image to build or pull first, when it is not built yet (set by the deploy). */
  image?: ResolvedImage | undefined
}

// v2: keys cover the tenant and, for installs that read the project, the whole project; v1
// environments (keyed by the manifest alone, shared across tenants) are never reused. v3: the
// project is covered by the runtime's tree digest (read through its port).
const ENV_FORMAT = 'env-v3'

/**
 * Why the tenant is always in the key: an install is not hermetic. It runs the project's own
 * lifecycle scripts and build backends, with the tenant's `setup` secrets and its network
 * allowlist, and fetches from registries whose answers can change; a lockfile pins names and
 * versions, not what those scripts do. So an environment is shared only within a tenant, between
 * revisions whose install reads the same bytes.
 */
async function environmentKey(
  kind: DependencyKind,
  tenantId: string,
  project: ProjectFiles,
  files: string[],
  readsProject: boolean,
  command: string[],
): Promise<string> {
  const hash = createHash('sha256').update(`${ENV_FORMAT}\0${tenantId}\0${command.join(' ')}\0`)
  for (const file of files) {
    hash.update(`${file}\0`)
    hash.update(await project.read(file))
    hash.update('\0')
  }
  if (readsProject) {
    hash.update(`project\0${await project.digest()}\0`)
  }
  return `${kind}-${hash.digest('hex').slice(0, 32)}`
}

/**
 * Decides what a revision's build does, from the files at the project root. npm and
 * requirements.txt installs see only their manifest and lockfile (copied into the environment);
 * a pyproject.toml install builds the project, so it sees all of it.
 */
export async function planBuild(
  tenantId: string,
  project: ProjectFiles,
  setup: string[] | undefined,
): Promise<BuildPlan> {
  const found = new Set<string>()
  for (const file of [
    'package.json',
    'package-lock.json',
    'npm-shrinkwrap.json',
    'requirements.txt',
    'pyproject.toml',
  ])
    if (await project.has(file)) found.add(file)
  const has = (file: string) => found.has(file)
  const dependencies = async (
    kind: DependencyKind,
    files: string[],
    readsProject: boolean,
    command: string[],
  ): Promise<BuildPlan> => ({
    dependencies: {
      kind,
      files,
      readsProject,
      command,
      envKey: await environmentKey(kind, tenantId, project, files, readsProject, command),
    },
    setup,
  })
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
    return dependencies('node', files, false, command)
  }
  const pip = ['python3', '-m', 'pip', 'install', '--no-input', '--target', '/workspace/python']
  if (has('requirements.txt'))
    return dependencies('python', ['requirements.txt'], false, [...pip, '-r', 'requirements.txt'])
  if (has('pyproject.toml')) return dependencies('python', ['pyproject.toml'], true, [...pip, '/src'])
  return { dependencies: undefined, setup }
}
