import { constants } from 'node:fs'
import { type FileHandle, open, readlink, realpath } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'

/** Normalises an API path (relative to /workspace; a leading /workspace/ or / is accepted). */
export function workspaceRelative(raw: string): string {
  let value = raw.trim()
  if (value.startsWith('/workspace')) value = value.slice('/workspace'.length)
  if (value.includes('\0')) throw new CairnProblem('validation_failed', 'path contains a NUL byte')
  const segments = value.split('/').filter((s) => s !== '' && s !== '.')
  if (segments.includes('..'))
    throw new CairnProblem('validation_failed', `path escapes the workspace: ${raw}`)
  return segments.join('/')
}

function inside(root: string, candidate: string): boolean {
  return candidate === root || candidate.startsWith(`${root}/`)
}

/**
 * Resolves a workspace path on the host and refuses anything whose resolved location (after
 * following every symlink) is outside the workspace root.
 */
export async function resolveInside(root: string, rel: string): Promise<string> {
  const realRoot = await realpath(root)
  const target = path.join(realRoot, rel)
  let resolved: string
  try {
    resolved = await realpath(target)
  } catch {
    throw new CairnProblem('not_found', `no such file in the workspace: /workspace/${rel}`)
  }
  if (!inside(realRoot, resolved)) {
    throw new CairnProblem('forbidden', `/workspace/${rel} resolves outside the workspace`)
  }
  return resolved
}

/**
 * Opens a file for reading and checks, on the opened descriptor, that it is inside the root: an
 * agent that swaps a symlink in between the check and the open gains nothing. Non-blocking, so a
 * FIFO the agent made does not hold a thread of the server forever (callers check `isFile`).
 */
export async function openInside(root: string, rel: string): Promise<FileHandle> {
  const resolved = await resolveInside(root, rel)
  const handle = await open(resolved, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK)
  try {
    const actual = await readlink(`/proc/self/fd/${handle.fd}`)
    if (!inside(await realpath(root), actual)) {
      throw new CairnProblem('forbidden', `/workspace/${rel} resolves outside the workspace`)
    }
    return handle
  } catch (error) {
    await handle.close()
    throw error
  }
}
