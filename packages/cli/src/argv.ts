/** Options valid on every command and anywhere on the line (before a `--`). */
export interface GlobalFlags {
  json: boolean
  color: boolean | undefined
  apiUrl: string | undefined
  apiKey: string | undefined
}

const VALUE_FLAGS = { '--api-url': 'apiUrl', '--api-key': 'apiKey' } as const

/**
 * Takes the global flags out of argv so that each command's parser never sees them: `--json` then
 * works wherever it is placed (`cairn --json sessions list`, `cairn sessions list --json`).
 */
export function extractGlobalFlags(args: string[]): { args: string[]; flags: GlobalFlags } {
  const flags: GlobalFlags = { json: false, color: undefined, apiUrl: undefined, apiKey: undefined }
  const rest: string[] = []
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] as string
    if (arg === '--') {
      rest.push(...args.slice(i))
      break
    }
    if (arg === '--json') flags.json = true
    else if (arg === '--no-color') flags.color = false
    else if (arg === '--color') flags.color = true
    else if (arg in VALUE_FLAGS && i + 1 < args.length) {
      flags[VALUE_FLAGS[arg as keyof typeof VALUE_FLAGS]] = args[++i]
    } else {
      const eq = arg.indexOf('=')
      const name = eq > 0 ? arg.slice(0, eq) : ''
      if (name in VALUE_FLAGS) flags[VALUE_FLAGS[name as keyof typeof VALUE_FLAGS]] = arg.slice(eq + 1)
      else rest.push(arg)
    }
  }
  return { args: rest, flags }
}

/** Colour unless `--no-color`, `NO_COLOR` (any non-empty value) or a non-terminal; `FORCE_COLOR` and `--color` force it. */
export function useColor(flag: boolean | undefined, env: NodeJS.ProcessEnv, isTty: boolean): boolean {
  if (flag !== undefined) return flag
  if (env.NO_COLOR) return false
  if (env.FORCE_COLOR && env.FORCE_COLOR !== '0') return true
  return isTty && env.TERM !== 'dumb'
}
