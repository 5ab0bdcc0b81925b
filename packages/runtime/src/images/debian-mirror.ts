import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'

/**
 * The Debian mirror this host's apt uses (the first `deb` source that is not the security
 * archive, in /etc/apt/sources.list or a `.list`/`.sources` file beside it); undefined when none.
 */
export function hostDebianMirror(aptDir = '/etc/apt'): string | undefined {
  const files = [path.join(aptDir, 'sources.list')]
  try {
    for (const name of readdirSync(path.join(aptDir, 'sources.list.d')).sort())
      files.push(path.join(aptDir, 'sources.list.d', name))
  } catch {}
  for (const file of files) {
    let text: string
    try {
      text = readFileSync(file, 'utf8')
    } catch {
      continue
    }
    const uris = file.endsWith('.sources')
      ? [...text.matchAll(/^URIs:\s*(.+)$/gim)].flatMap((m) => (m[1] ?? '').trim().split(/\s+/))
      : [...text.matchAll(/^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)/gm)].map((m) => m[1] ?? '')
    const mirror = uris.find((u) => /^https?:\/\//.test(u) && !/security/.test(u))
    if (mirror) return mirror.replace(/\/+$/, '')
  }
  return undefined
}
