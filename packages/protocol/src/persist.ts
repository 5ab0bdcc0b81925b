import { type Static, Type } from '@sinclair/typebox'
import { CairnProblem } from './errors.js'

/**
 * The agent's home inside the sandbox when it declares `persist:` (`~` in a declared path). Agents
 * without `persist:` keep HOME=/workspace, as before.
 */
export const PERSIST_HOME = '/home/agent'

/**
 * Where a session's persisted paths are kept: inside its workspace subvolume, beside the
 * workspace's own files, at `.cairn-persist/<sandbox path without its leading slash>` (so
 * `~/.claude` is `.cairn-persist/home/agent/.claude`). Snapshots, forks, restores, exports,
 * shipping and quotas take it with the workspace; the sandbox never sees it under /workspace.
 */
export const PERSIST_DIR = '.cairn-persist'

/** At most this many paths in `persist:`. */
export const PERSIST_MAX_PATHS = 16
/** At most this many characters in one declared path. */
export const PERSIST_MAX_PATH_CHARS = 256

/** cairn.yaml's `persist:` as the schema takes it; `resolvePersistPaths` checks the values. */
export const PersistSchema = Type.Array(Type.String({ minLength: 1, maxLength: PERSIST_MAX_PATH_CHARS }), {
  maxItems: PERSIST_MAX_PATHS,
})

/**
 * Sandbox paths no persisted path may be, be inside or contain: the sandbox's own mounts (the
 * workspace, the kernel's, scratch, Cairn's run and kit directories, memory, the dependency
 * environment) and the read-only system tree.
 */
export const PERSIST_RESERVED = [
  '/workspace',
  '/proc',
  '/sys',
  '/dev',
  '/tmp',
  '/run',
  '/opt/cairn',
  '/memory',
  '/env',
  '/usr',
  '/bin',
  '/sbin',
  '/lib',
  '/lib32',
  '/lib64',
  '/libx32',
  '/etc',
  '/boot',
] as const

/** One declared path: as written, where the sandbox sees it, where the workspace subvolume keeps it. */
export const PersistedPathSchema = Type.Object({
  /** As cairn.yaml declares it (`~/.claude`). */
  path: Type.String(),
  /** The absolute path inside the sandbox (`/home/agent/.claude`). */
  sandboxPath: Type.String(),
  /** Where diffs, exports and file reads name it, relative to the workspace root. */
  workspacePath: Type.String(),
})
export type PersistedPath = Static<typeof PersistedPathSchema>

const under = (inner: string, outer: string) => inner === outer || inner.startsWith(`${outer}/`)

function refuse(index: number, value: string, why: string): never {
  throw new CairnProblem('invalid_manifest', `cairn.yaml: persist[${index}]: '${value}' ${why}`, {
    key: 'persist',
    index,
    value,
  })
}

/** One declared path as the sandbox's absolute path, or `invalid_manifest` saying why not. */
function sandboxPathOf(value: string, index: number): string {
  if (/[\0-\x1f\x7f]/.test(value)) refuse(index, value, 'has a control character')
  const expanded =
    value === '~' ? PERSIST_HOME : value.startsWith('~/') ? PERSIST_HOME + value.slice(1) : value
  if (!expanded.startsWith('/')) refuse(index, value, "is neither absolute nor under the home ('~/…')")
  const trimmed = expanded.length > 1 && expanded.endsWith('/') ? expanded.slice(0, -1) : expanded
  const segments = trimmed.split('/').slice(1)
  if (trimmed === '/') refuse(index, value, 'is the whole root; name the directories to keep')
  for (const segment of segments) {
    if (segment === '') refuse(index, value, "has an empty name ('//')")
    if (segment === '.' || segment === '..') refuse(index, value, `has a '${segment}' name`)
    if (Buffer.byteLength(segment) > 255) refuse(index, value, 'has a name longer than 255 bytes')
  }
  for (const reserved of PERSIST_RESERVED) {
    if (under(trimmed, reserved) || under(reserved, trimmed))
      refuse(
        index,
        value,
        `${trimmed === reserved ? 'is' : 'overlaps'} ${reserved}, which the sandbox mounts itself`,
      )
  }
  if (under(PERSIST_HOME, trimmed) && trimmed !== PERSIST_HOME)
    refuse(index, value, `contains the home ${PERSIST_HOME}; declare '~' or paths under it`)
  return trimmed
}

/**
 * cairn.yaml's `persist:` checked and resolved (deploy refuses what this refuses, with
 * `invalid_manifest` and `details.index`): each entry an absolute path or `~`/`~/…`, no empty,
 * `.` or `..` names, nothing of the sandbox's own mounts (`PERSIST_RESERVED`), no entry inside
 * another, at most `PERSIST_MAX_PATHS`.
 */
export function resolvePersistPaths(declared: readonly string[] | undefined): PersistedPath[] {
  const list = declared ?? []
  if (list.length > PERSIST_MAX_PATHS)
    throw new CairnProblem(
      'invalid_manifest',
      `cairn.yaml: persist: at most ${PERSIST_MAX_PATHS} paths (got ${list.length})`,
      { key: 'persist' },
    )
  const resolved: PersistedPath[] = []
  for (const [index, value] of list.entries()) {
    if (typeof value !== 'string' || value.length === 0 || value.length > PERSIST_MAX_PATH_CHARS)
      refuse(index, String(value), `is not a path of 1 to ${PERSIST_MAX_PATH_CHARS} characters`)
    const sandboxPath = sandboxPathOf(value, index)
    const clash = resolved.find((p) => under(p.sandboxPath, sandboxPath) || under(sandboxPath, p.sandboxPath))
    if (clash) refuse(index, value, `overlaps '${clash.path}' (declare one of them)`)
    resolved.push({ path: value, sandboxPath, workspacePath: `${PERSIST_DIR}${sandboxPath}` })
  }
  return resolved
}

/** Whether a workspace-relative path (no leading slash) is Cairn's persisted-paths directory or inside it. */
export function isPersistPath(rel: string): boolean {
  return rel === PERSIST_DIR || rel.startsWith(`${PERSIST_DIR}/`)
}
