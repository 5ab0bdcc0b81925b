import { existsSync } from 'node:fs'
import { chmod, mkdir, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

/** The CLI's credentials file: `$CAIRN_CONFIG_DIR`, else `$XDG_CONFIG_HOME/cairn`, else `~/.config/cairn`. */
export function credentialsPath(): string {
  const dir =
    process.env.CAIRN_CONFIG_DIR ??
    path.join(process.env.XDG_CONFIG_HOME ?? path.join(os.homedir(), '.config'), 'cairn')
  return path.join(dir, 'credentials.json')
}

/** Writes `{apiUrl, apiKey}` with mode 0600 unless a credentials file already exists. */
export async function writeCredentialsIfMissing(apiUrl: string, apiKey: string): Promise<string | undefined> {
  const file = credentialsPath()
  if (existsSync(file)) return undefined
  await mkdir(path.dirname(file), { recursive: true, mode: 0o700 })
  await writeFile(file, `${JSON.stringify({ apiUrl, apiKey }, null, 2)}\n`, { mode: 0o600 })
  await chmod(file, 0o600)
  return file
}
