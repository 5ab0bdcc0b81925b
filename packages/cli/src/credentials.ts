// node:fs, not node:fs/promises: every command that makes a request reads this file, and
// fs/promises (with the readline internals it loads) costs a command ~2 ms of CPU to load
// (docs/benchmarks/cli.md). The file is a few bytes; nothing else runs meanwhile.
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { CliError } from './errors.js'

export interface Credentials {
  apiUrl?: string
  apiKey?: string
}

/** `$CAIRN_CONFIG_DIR/credentials.json`, else `$XDG_CONFIG_HOME/cairn/…`, else `~/.config/cairn/…` (the server writes the same file). */
export function credentialsPath(env: NodeJS.ProcessEnv = process.env): string {
  const dir =
    env.CAIRN_CONFIG_DIR || path.join(env.XDG_CONFIG_HOME || path.join(os.homedir(), '.config'), 'cairn')
  return path.join(dir, 'credentials.json')
}

/** The saved credentials, or `undefined` when there is no file. A broken file is an error, not silence. */
export async function readCredentials(file = credentialsPath()): Promise<Credentials | undefined> {
  let text: string
  try {
    text = readFileSync(file, 'utf8')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw error
  }
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch {
    throw new CliError(`${file} is not valid JSON`, { hint: 'Run `cairn login` to write it again.' })
  }
  if (typeof parsed !== 'object' || parsed === null) {
    throw new CliError(`${file} does not hold an object`, { hint: 'Run `cairn login` to write it again.' })
  }
  const { apiUrl, apiKey } = parsed as Record<string, unknown>
  const out: Credentials = {}
  if (typeof apiUrl === 'string' && apiUrl !== '') out.apiUrl = apiUrl
  if (typeof apiKey === 'string' && apiKey !== '') out.apiKey = apiKey
  return out
}

/** Writes `{apiUrl, apiKey}` readable by the owner only. */
export async function writeCredentials(
  credentials: Required<Credentials>,
  file = credentialsPath(),
): Promise<string> {
  mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 })
  writeFileSync(
    file,
    `${JSON.stringify({ apiUrl: credentials.apiUrl, apiKey: credentials.apiKey }, null, 2)}\n`,
    {
      mode: 0o600,
    },
  )
  chmodSync(file, 0o600)
  return file
}

/** Removes the file; `false` when there was none. */
export async function removeCredentials(file = credentialsPath()): Promise<boolean> {
  try {
    rmSync(file)
    return true
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return false
    throw error
  }
}
