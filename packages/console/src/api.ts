import { Cairn, CairnError } from '@cairn/sdk'

/** The API key lives in sessionStorage only: gone when the tab closes, never in a URL or a log. */
const STORAGE_KEY = 'cairn.apiKey'

export function storedKey(): string | undefined {
  try {
    return sessionStorage.getItem(STORAGE_KEY) ?? undefined
  } catch {
    return undefined
  }
}

export function storeKey(key: string): void {
  sessionStorage.setItem(STORAGE_KEY, key)
}

export function forgetKey(): void {
  sessionStorage.removeItem(STORAGE_KEY)
}

/** A client for this origin's API with the given key (the console is served by the server it talks to). */
export function makeClient(apiKey: string): Cairn {
  return new Cairn({ apiKey, baseUrl: location.origin })
}

/** The message to show for an error: the API's own message and code. */
export function describeError(error: unknown): string {
  if (error instanceof CairnError) {
    const where = error.status === undefined ? error.code : `${error.code}, HTTP ${error.status}`
    return `${error.message} (${where})`
  }
  return error instanceof Error ? error.message : String(error)
}

export function isUnauthorized(error: unknown): boolean {
  return error instanceof CairnError && error.code === 'unauthorized'
}

export function isAborted(error: unknown): boolean {
  return (
    (error instanceof CairnError && error.code === 'aborted') ||
    (error instanceof DOMException && error.name === 'AbortError')
  )
}
