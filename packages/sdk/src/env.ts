/** Reads an environment variable where there is one (Node, Bun, Deno with --allow-env); never throws in a browser. */
export function readEnv(name: string): string | undefined {
  try {
    const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process
    const value = proc?.env?.[name]
    return value === undefined || value === '' ? undefined : value
  } catch {
    return undefined
  }
}
