import { createHash } from 'node:crypto'
import {
  AGENT_NAME_PATTERN,
  type AgentManifest,
  AgentManifestSchema,
  type AgentProtocolName,
  CairnProblem,
  findUnknownKey,
  PERSIST_DIR,
  PLANNED_MANIFEST_KEYS,
  resolvePersistPaths,
  unknownKeyMessage,
} from '@cairn/protocol'
import { FORWARDER_PORTS } from '@cairn/runtime/port'
import { Value } from '@sinclair/typebox/value'
import YAML from 'yaml'
import { type ProjectFiles, projectInDirectory } from './project-files.js'

export const MANIFEST_FILES = ['cairn.yaml', 'cairn.yml']

export interface ResolvedManifest {
  manifest: AgentManifest
  name: string
  command: string[]
  protocol: AgentProtocolName
}

/** Splits a command line into argv with single quotes, double quotes and backslash escapes. */
export function splitCommand(line: string): string[] {
  const args: string[] = []
  let current = ''
  let quote: '"' | "'" | undefined
  let inWord = false
  for (let i = 0; i < line.length; i++) {
    const ch = line[i] as string
    if (quote) {
      if (ch === quote) quote = undefined
      else if (ch === '\\' && quote === '"' && i + 1 < line.length) current += line[++i]
      else current += ch
    } else if (ch === '"' || ch === "'") {
      quote = ch
      inWord = true
    } else if (ch === '\\' && i + 1 < line.length) {
      current += line[++i]
      inWord = true
    } else if (/\s/.test(ch)) {
      if (inWord) args.push(current)
      current = ''
      inWord = false
    } else {
      current += ch
      inWord = true
    }
  }
  if (quote) throw new CairnProblem('invalid_manifest', `unterminated quote in command: ${line}`)
  if (inWord) args.push(current)
  return args
}

/** The project with `cairn.yaml` given beside it: it wins over the project's own (and over cairn.yml). */
export function withManifest(project: ProjectFiles, manifest: string): ProjectFiles {
  const given = (rel: string) => rel === MANIFEST_FILES[0]
  return {
    has: async (rel) => given(rel) || (await project.has(rel)),
    read: async (rel) => (given(rel) ? Buffer.from(manifest) : await project.read(rel)),
    digest: () => project.digest(),
  }
}

/** An archive's content hash with a cairn.yaml given beside it folded in. */
export function hashWithManifest(contentHash: string, manifest: string): string {
  const hash = createHash('sha256').update(`${contentHash}\0${MANIFEST_FILES[0]}\0`).update(manifest)
  return `sha256:${hash.digest('hex')}`
}

/** The project's cairn.yaml, checked (`project`: its files, or a directory of this machine). */
export async function readManifest(
  project: ProjectFiles | string,
  nameOverride?: string,
): Promise<ResolvedManifest> {
  const files = typeof project === 'string' ? projectInDirectory(project) : project
  let file: string | undefined
  for (const name of MANIFEST_FILES) if (!file && (await files.has(name))) file = name
  if (!file) throw new CairnProblem('invalid_manifest', 'the archive has no cairn.yaml at its root')
  let text: string
  try {
    text = (await files.read(file)).toString('utf8')
  } catch (error) {
    throw new CairnProblem('invalid_manifest', `${file} could not be read: ${(error as Error).message}`)
  }
  let raw: unknown
  try {
    raw = YAML.parse(text)
  } catch (error) {
    throw new CairnProblem('invalid_manifest', `cairn.yaml is not valid YAML: ${(error as Error).message}`)
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new CairnProblem('invalid_manifest', 'cairn.yaml must be a mapping')
  }
  const candidate = { ...(raw as Record<string, unknown>) }
  if (nameOverride !== undefined) candidate.name = nameOverride
  // Before the check of values: a misspelt `netwrok:` or `limtis:` would otherwise drop a policy
  // in silence, and a key of a later release (`image:`) deploy as if it were honoured.
  const unknown = findUnknownKey(AgentManifestSchema, candidate)
  if (unknown) {
    throw new CairnProblem(
      'invalid_manifest',
      unknownKeyMessage(unknown, 'cairn.yaml', 'key', PLANNED_MANIFEST_KEYS),
      { key: unknown.key, path: unknown.path },
    )
  }
  const known = Value.Clean(AgentManifestSchema, Value.Clone(candidate))
  if (!Value.Check(AgentManifestSchema, known)) {
    const first = [...Value.Errors(AgentManifestSchema, known)][0]
    const where = first?.path ? first.path.slice(1).replace(/\//g, '.') : 'cairn.yaml'
    const hint =
      where === 'name' ? ` (lower-case letters, digits and '-', matching ${AGENT_NAME_PATTERN})` : ''
    throw new CairnProblem('invalid_manifest', `cairn.yaml: ${where}: ${first?.message ?? 'invalid'}${hint}`)
  }
  const manifest = known
  const command =
    typeof manifest.command === 'string' ? splitCommand(manifest.command) : [...manifest.command]
  if (command.length === 0) throw new CairnProblem('invalid_manifest', 'cairn.yaml: command is empty')
  const protocol = manifest.protocol ?? 'stdio'
  checkHttpAgent(protocol, manifest.http)
  checkPersist(manifest)
  // The name of the persisted paths' store in every workspace: a project may not bring its own.
  if (await files.has(PERSIST_DIR))
    throw new CairnProblem(
      'invalid_archive',
      `the project has ${PERSIST_DIR} at its root, a name Cairn keeps for persisted paths: rename it or leave it out`,
      { path: PERSIST_DIR },
    )
  return { manifest, name: manifest.name, command, protocol }
}

/** `protocol: http` needs `http.port`; `http:` under another protocol would be ignored, so it is refused. */
function checkHttpAgent(protocol: AgentProtocolName, http: AgentManifest['http']): void {
  if (protocol === 'http' && !http)
    throw new CairnProblem(
      'invalid_manifest',
      'cairn.yaml: protocol http needs the port the agent serves on: http: { port: 8000 } (path defaults to /run)',
      { key: 'http' },
    )
  if (protocol !== 'http' && http)
    throw new CairnProblem(
      'invalid_manifest',
      `cairn.yaml: http: is for protocol: http agents; this one is ${protocol} (remove http:, or set protocol: http)`,
      { key: 'http' },
    )
  if (http && FORWARDER_PORTS.has(http.port))
    throw new CairnProblem(
      'invalid_manifest',
      `cairn.yaml: http.port ${http.port} is taken by Cairn's egress forwarder inside the sandbox; choose another port`,
      { key: 'http.port', port: http.port },
    )
}

/** `persist:` resolved (`invalid_manifest` names the entry), and not under gVisor, which does not mount it yet. */
function checkPersist(manifest: AgentManifest): void {
  const paths = resolvePersistPaths(manifest.persist)
  if (paths.length > 0 && manifest.isolation === 'gvisor')
    throw new CairnProblem(
      'invalid_manifest',
      'cairn.yaml: persist: is not supported with isolation: gvisor yet (use bwrap, or keep the state in /workspace)',
      { key: 'persist' },
    )
}
