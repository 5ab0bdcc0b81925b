import { CairnProblem } from '@cairn/protocol'

const SLASH = 0x2f
const WORKSPACE = Buffer.from('/workspace')
const NAME_MAX_BYTES = 255

/** Normalises an API path (relative to /workspace; a leading /workspace/ or / is accepted). */
export function workspaceRelative(raw: string): string {
  return workspaceRelativeBytes(Buffer.from(raw.trim(), 'utf8')).toString('utf8')
}

/**
 * `workspaceRelative` on a path's bytes (names need not be UTF-8: the API takes them as base64).
 * Only a syntactic normalisation: what the path leads to is found by the reader's walk, which
 * never follows a link.
 */
export function workspaceRelativeBytes(raw: Buffer): Buffer {
  let value = raw
  if (value.subarray(0, WORKSPACE.length).equals(WORKSPACE)) value = value.subarray(WORKSPACE.length)
  if (value.includes(0)) throw new CairnProblem('validation_failed', 'path contains a NUL byte')
  const segments: Buffer[] = []
  let start = 0
  for (let i = 0; i <= value.length; i++) {
    if (i < value.length && value[i] !== SLASH) continue
    const segment = value.subarray(start, i)
    start = i + 1
    if (segment.length === 0 || (segment.length === 1 && segment[0] === 0x2e)) continue
    if (segment.length === 2 && segment[0] === 0x2e && segment[1] === 0x2e)
      throw new CairnProblem('validation_failed', `path escapes the workspace: ${raw.toString('utf8')}`)
    // NAME_MAX: the file system answers ENAMETOOLONG, which no caller should see as a storage error.
    if (segment.length > NAME_MAX_BYTES)
      throw new CairnProblem('validation_failed', `a name in the path is longer than ${NAME_MAX_BYTES} bytes`)
    segments.push(segment)
  }
  const out: Buffer[] = []
  for (const [i, segment] of segments.entries()) {
    if (i > 0) out.push(Buffer.from('/'))
    out.push(segment)
  }
  return Buffer.concat(out)
}

/** The path a request names: `pathBase64` (the exact bytes) when given, else `path`. */
export function requestedPath(query: { path?: string | undefined; pathBase64?: string | undefined }): Buffer {
  if (query.pathBase64 !== undefined) return workspaceRelativeBytes(Buffer.from(query.pathBase64, 'base64'))
  return workspaceRelativeBytes(Buffer.from((query.path ?? '').trim(), 'utf8'))
}
