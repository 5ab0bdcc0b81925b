import { existsSync } from 'node:fs'
import { readdir, readFile } from 'node:fs/promises'
import path from 'node:path'
import {
  AGENT_NAME_PATTERN,
  AgentManifestSchema,
  type AgentProtocolName,
  findUnknownKey,
  PLANNED_MANIFEST_KEYS,
  unknownKeyMessage,
} from '@cairn/protocol'
import YAML from 'yaml'
import { CliError } from '../errors.js'

export const MANIFEST_FILES = ['cairn.yaml', 'cairn.yml'] as const

/** Files taken as the entry point of a directory without cairn.yaml, in order of preference. */
export const ENTRY_CANDIDATES = [
  'agent.py',
  'main.py',
  'app.py',
  'agent.ts',
  'main.ts',
  'index.ts',
  'agent.js',
  'main.js',
  'index.js',
  'agent.mjs',
  'main.mjs',
  'index.mjs',
  'agent.sh',
  'main.sh',
  'run.sh',
] as const

const INTERPRETERS: Record<string, string> = {
  '.py': 'python3',
  '.ts': 'tsx',
  '.mts': 'tsx',
  '.js': 'node',
  '.mjs': 'node',
  '.cjs': 'node',
  '.sh': 'bash',
}

export interface LocalManifest {
  file: string
  data: Record<string, unknown>
  name: string | undefined
  ignore: string[]
}

/**
 * Reads the project's cairn.yaml (or .yml) when there is one, refusing keys nobody reads. The server
 * validates the values.
 */
export async function readLocalManifest(dir: string): Promise<LocalManifest | undefined> {
  for (const name of MANIFEST_FILES) {
    const file = path.join(dir, name)
    let text: string
    try {
      text = await readFile(file, 'utf8')
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') continue
      throw error
    }
    let data: unknown
    try {
      data = YAML.parse(text)
    } catch (error) {
      throw new CliError(`${file} is not valid YAML: ${(error as Error).message}`, {
        code: 'invalid_manifest',
      })
    }
    if (data === null || typeof data !== 'object' || Array.isArray(data)) {
      throw new CliError(`${file} must be a mapping (name: …, command: …)`, { code: 'invalid_manifest' })
    }
    const record = data as Record<string, unknown>
    // Refused here too, before anything is packed: a misspelt `ignroe:` would upload what it meant
    // to leave out (the server refuses the same keys with the same message).
    const unknown = findUnknownKey(AgentManifestSchema, record)
    if (unknown) {
      throw new CliError(unknownKeyMessage(unknown, name, 'key', PLANNED_MANIFEST_KEYS), {
        code: 'invalid_manifest',
      })
    }
    const ignore = Array.isArray(record.ignore)
      ? record.ignore.filter((g): g is string => typeof g === 'string')
      : []
    return { file, data: record, name: typeof record.name === 'string' ? record.name : undefined, ignore }
  }
  return undefined
}

/** The command that runs an entry file, by its extension; `undefined` when the extension is unknown. */
export function inferCommand(entry: string): string[] | undefined {
  const interpreter = INTERPRETERS[path.extname(entry).toLowerCase()]
  return interpreter === undefined ? undefined : [interpreter, entry.split(path.sep).join('/')]
}

/**
 * The entry file of a directory without cairn.yaml: a conventional name (agent.py, main.js …), else
 * the only file at the root that Cairn knows how to run.
 */
export async function findEntry(dir: string): Promise<string | undefined> {
  const known = ENTRY_CANDIDATES.find((f) => existsSync(path.join(dir, f)))
  if (known !== undefined) return known
  const entries = await readdir(dir, { withFileTypes: true })
  const runnable = entries.filter((e) => e.isFile() && inferCommand(e.name) !== undefined).map((e) => e.name)
  return runnable.length === 1 ? runnable[0] : undefined
}

/** A valid agent name made from a directory or file name ("My Agent_2" → "my-agent-2"). */
export function agentNameFrom(text: string): string {
  const name = text
    .toLowerCase()
    .replace(/[^a-z0-9-]+/g, '-')
    .replace(/-+/g, '-')
    .replace(/^-+/, '')
    .slice(0, 63)
    .replace(/-+$/, '')
  return new RegExp(AGENT_NAME_PATTERN).test(name) ? name : 'agent'
}

export function isValidAgentName(name: string): boolean {
  return new RegExp(AGENT_NAME_PATTERN).test(name)
}

function commandYaml(command: string[]): string {
  return command.every((arg) => /^[\w./@%+=:,-]+$/.test(arg)) ? command.join(' ') : JSON.stringify(command)
}

export interface ManifestFields {
  name: string
  command: string[]
  protocol: AgentProtocolName
}

/** cairn.yaml text. With `comments`, every key is explained and the optional ones shown commented out. */
export function renderManifest(fields: ManifestFields, comments: boolean): string {
  const name = YAML.stringify(fields.name).trimEnd()
  const command = commandYaml(fields.command)
  if (!comments) return `name: ${name}\ncommand: ${command}\nprotocol: ${fields.protocol}\n`
  return `# cairn.yaml: how Cairn runs this agent. Deploy it with \`cairn deploy\`.

# The agent's name: lower-case letters, digits and '-'.
name: ${name}

# What starts the agent. It runs in /workspace, a copy of this directory that persists per session.
command: ${command}

# How Cairn talks to the agent:
#   stdio  each stdin line is the next user message, stdout is the reply (a plain input()/print() loop)
#   jsonl  JSON frames on stdin/stdout (text, status, tool.start, tool.end, turn.done, error)
#   exec   one process per turn: the message on stdin, the process exit ends the turn
#   http   the agent serves HTTP on a port; each message is a POST (add http: { port: 8000 })
protocol: ${fields.protocol}

# Left out of the upload, like .gitignore (.git, node_modules, .venv, __pycache__ and .env* always are):
# ignore:
#   - data/*.csv

# Secrets the agent reads from its environment:
# secrets:
#   - ANTHROPIC_API_KEY

# Limits per session:
# limits:
#   memoryMiB: 512
#   pids: 256
#   cpus: 1
#   turnTimeoutMs: 600000

# Directories outside /workspace kept with each session, like it (~ is then the home, /home/agent):
# persist:
#   - ~/.cache/my-tool
`
}
