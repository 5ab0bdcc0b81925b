import { execFile } from 'node:child_process'
import { promisify } from 'node:util'

const run = promisify(execFile)

/** An http(s) URL as an allowlist entry (`host`, or `host:port` off the default ports). */
export function registryRule(url: string): string | undefined {
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    return undefined
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') return undefined
  if (!parsed.hostname) return undefined
  return parsed.port ? `${parsed.hostname}:${parsed.port}` : parsed.hostname
}

/** The index URLs in `pip config list` output (`global.index-url='…'`, `:env:.extra-index-url='…'`). */
export function pipIndexUrls(configList: string): { index: string[]; extra: string[] } {
  const index: string[] = []
  const extra: string[] = []
  for (const line of configList.split('\n')) {
    const match = /^[^=]*\.(index-url|extra-index-url)='?([^']*)'?$/.exec(line.trim())
    if (!match?.[2]) continue
    const urls = match[2].split(/\s+/).filter(Boolean)
    if (match[1] === 'index-url') index.push(...urls)
    else extra.push(...urls)
  }
  return { index, extra }
}

async function output(command: string, args: string[]): Promise<string | undefined> {
  try {
    return (await run(command, args, { timeout: 10_000 })).stdout
  } catch {
    return undefined
  }
}

/**
 * The registries npm and pip are configured with on this host, as allowlist entries: npm's
 * `registry`, pip's `index-url` (default PyPI, whose files are on files.pythonhosted.org) and
 * `extra-index-url`s. Non-http indexes (`file://`) need no network and are left out.
 */
export async function hostRegistries(): Promise<string[]> {
  const [npmRegistry, pipConfig] = await Promise.all([
    output('npm', ['config', 'get', 'registry']),
    output('python3', ['-m', 'pip', 'config', 'list']),
  ])
  const rules = new Set<string>()
  const npmRule = npmRegistry ? registryRule(npmRegistry.trim()) : undefined
  rules.add(npmRule ?? 'registry.npmjs.org')
  const pip = pipIndexUrls(pipConfig ?? '')
  if (pip.index.length === 0) {
    rules.add('pypi.org')
    rules.add('files.pythonhosted.org')
  }
  for (const url of [...pip.index, ...pip.extra]) {
    const rule = registryRule(url)
    if (rule) rules.add(rule)
    if (rule === 'pypi.org') rules.add('files.pythonhosted.org')
  }
  return [...rules]
}
